package bpf

// The tag of a Method* in a user stack (offcpu_shared.h JAVA_METHOD_TAG):
// an interpreter frame's entry is its Method* with these top bits.
const (
	JavaMethodTag  = 0xa000000000000000
	JavaMethodMask = 0x0000ffffffffffff
)
