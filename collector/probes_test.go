package collector

import (
	"os"
	"testing"
)

// The exec program's mappings are used only where the kernel has the VMA
// iterator; a kfunc that does not exist reads as absent.
func TestKernelHasFunc(t *testing.T) {
	if _, err := os.Stat(vmlinuxBTF); err != nil {
		t.Skip("no kernel BTF")
	}
	if !kernelHasFunc("bpf_find_vma") && !kernelHasFunc("bpf_iter_task_vma_new") {
		t.Errorf("neither bpf_find_vma nor bpf_iter_task_vma_new found in the kernel's BTF")
	}
	if kernelHasFunc("bpf_iter_task_vma_nope") {
		t.Errorf("a function that does not exist was found")
	}
}
