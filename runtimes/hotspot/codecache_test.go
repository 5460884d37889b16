package hotspot

import (
	"bufio"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/offcpu/offcpu/internal/testenv"
)

// Attach finds libjvm.so in a process's mappings and opens its VM.
func attach(pid int) (*VM, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 6 || !strings.HasSuffix(fs[5], "/libjvm.so") || fs[2] != "00000000" {
			continue
		}
		start, _ := strconv.ParseUint(strings.Split(fs[0], "-")[0], 16, 64)
		lib, err := elf.Open(fs[5])
		if err != nil {
			return nil, err
		}
		defer lib.Close()
		mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
		if err != nil {
			return nil, err
		}
		return Open(mem, lib, start)
	}
	return nil, fmt.Errorf("no libjvm.so in process %d", pid)
}

// A JVM started with no flag: its code cache lists the interpreter and
// compiled methods, and a compiled method is named as the source says.
func TestCodeCacheOfUnmodifiedJVM(t *testing.T) {
	for ver, dir := range testenv.JDKHomes(t) {
		t.Run("jdk"+ver, func(t *testing.T) {
			tmp := t.TempDir()
			if out, err := exec.Command(filepath.Join(dir, "bin", "javac"), "-d", tmp, "../../collector/testdata/jvm/Contend.java").CombinedOutput(); err != nil {
				t.Fatalf("javac: %v\n%s", err, out)
			}
			cmd := exec.Command(filepath.Join(dir, "bin", "java"), "-cp", tmp, "Contend", "20000")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { cmd.Process.Kill(); cmd.Wait() }()
			var cc *CodeCache
			var vm *VM
			var err error
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
				if vm == nil {
					vm, err = attach(cmd.Process.Pid)
					if err != nil {
						continue
					}
				}
				cc, err = vm.CodeCache()
				if err != nil {
					continue
				}
				if named(vm, cc, "Contend.holdLock") {
					break
				}
			}
			if cc == nil {
				t.Fatalf("no code cache: %v", err)
			}
			kinds := map[Kind]int{}
			for _, b := range cc.Blobs {
				kinds[b.Kind]++
			}
			t.Logf("JVM %s: code cache %#x-%#x, %d blobs (%d compiled, %d interpreter)", vm.Version, cc.Low, cc.High, len(cc.Blobs), kinds[KindCompiled], kinds[KindInterpreter])
			if kinds[KindInterpreter] != 1 {
				t.Errorf("%d interpreter blobs, want 1", kinds[KindInterpreter])
			}
			if !named(vm, cc, "Contend.holdLock") {
				t.Errorf("no compiled blob named Contend.holdLock among %d compiled", kinds[KindCompiled])
			}
			for _, b := range cc.Blobs {
				if b.Start < cc.Low || b.End > cc.High {
					t.Errorf("blob %s %#x-%#x outside the code cache", b.Name, b.Start, b.End)
				}
			}
			// The pcs of compiled holdLock carry its source lines: its body
			// is lines 9 to 16 of Contend.java.
			lines := map[int]bool{}
			for _, b := range cc.Blobs {
				if n, _ := vm.MethodName(b.Method); b.Kind != KindCompiled || n != "Contend.holdLock" {
					continue
				}
				for pc := b.Start; pc < b.End; pc++ {
					fs, err := vm.Frames(b, pc)
					if err != nil {
						t.Fatalf("Frames(%#x): %v", pc, err)
					}
					if f := fs[len(fs)-1]; f.Name != "Contend.holdLock" {
						t.Fatalf("outermost frame at %#x in holdLock: %+v", pc, fs)
					} else if f.Line != 0 {
						lines[f.Line] = true
					}
				}
			}
			for l := range lines {
				if l < 9 || l > 16 {
					t.Errorf("holdLock frame at line %d, want 9 to 16 (lines seen %v)", l, lines)
				}
			}
			if len(lines) < 2 {
				t.Errorf("holdLock's compiled pcs name lines %v, want several of 9 to 16", lines)
			}
		})
	}
}

func named(vm *VM, cc *CodeCache, want string) bool {
	for _, b := range cc.Blobs {
		if b.Kind != KindCompiled {
			continue
		}
		if n, err := vm.MethodName(b.Method); err == nil && n == want {
			return true
		}
	}
	return false
}
