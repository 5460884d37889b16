package bpf

// An interpreter frame's entry in a user stack (offcpu_shared.h): its
// Method* with JavaMethodTag in the top bits, and its bci in the bits the
// Method* leaves free (JavaMethodMask: the Method*, and bci & 7 in its
// low bits).

// JavaFrame splits an interpreter frame's entry into its Method* and its
// bci (JavaBciNone: not known).
func JavaFrame(entry uint64) (method uint64, bci int) {
	low := entry & JavaMethodMask
	return low &^ 7, int((entry>>47)&0x1fff)<<3 | int(low&7)
}
