package schema

import "testing"

func TestIsThreadStart(t *testing.T) {
	for fn, want := range map[string]bool{
		"__clone3": true, "start_thread": true, "__GI___clone3": true, "runtime.goexit.abi0": true, "_start": true,
		"main": false, "pthread_cond_wait": false, "[unknown]": false, "runtime.goexitfoo": false,
	} {
		if got := IsThreadStart(fn); got != want {
			t.Errorf("IsThreadStart(%q) = %v, want %v", fn, got, want)
		}
	}
}
