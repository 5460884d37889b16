// Built by the symbolizer tests with and without symbols.
#include <cstdio>

namespace shop {
struct Widget {
	__attribute__((noinline)) int spin(int n);
};
int Widget::spin(int n) {
	int s = 0;
	for (int i = 0; i < n; i++) s += i * 3;
	return s;
}
}  // namespace shop

extern "C" __attribute__((noinline)) int plain_c_function(int x) { return x * 7 + 1; }

int main(int argc, char **argv) {
	shop::Widget w;
	std::printf("%d %d\n", w.spin(argc), plain_c_function(argc));
	return 0;
}
