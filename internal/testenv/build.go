package testenv

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Programs the tests build (gcc, go build) can come prebuilt, for a
// kernel booted under qemu with no compiler (tools/kmatrix):
// OFFCPU_PREBUILD_OUT=DIR keeps a copy of each program built,
// OFFCPU_PREBUILT=DIR takes it from there. A program is named by a hash
// of its build command, the output path left out.
const (
	EnvPrebuilt    = "OFFCPU_PREBUILT"
	EnvPrebuildOut = "OFFCPU_PREBUILD_OUT"
)

// Build runs a build command (name args..., with "-o OUT") or takes OUT
// prebuilt; the test fails if it cannot.
func Build(t testing.TB, name string, args ...string) {
	t.Helper()
	if err := BuildIn("", name, args...); err != nil {
		t.Fatal(err)
	}
}

// BuildIn is Build run in dir ("" for the current one).
func BuildIn(dir, name string, args ...string) error {
	out, key := buildOutput(dir, name, args)
	if pre := os.Getenv(EnvPrebuilt); pre != "" && out != "" {
		if err := copyExec(filepath.Join(pre, key), absIn(dir, out)); err != nil {
			return fmt.Errorf("prebuilt %s %v: %v (build it on the host with %s set)", name, args, err, EnvPrebuildOut)
		}
		return nil
	}
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %v: %v\n%s", name, args, err, b)
	}
	if keep := os.Getenv(EnvPrebuildOut); keep != "" && out != "" {
		if err := os.MkdirAll(keep, 0o755); err != nil {
			return err
		}
		if err := copyExec(absIn(dir, out), filepath.Join(keep, key)); err != nil {
			return fmt.Errorf("keeping %s: %v", out, err)
		}
	}
	return nil
}

func absIn(dir, path string) string {
	if filepath.IsAbs(path) || dir == "" {
		return path
	}
	return filepath.Join(dir, path)
}

// buildOutput is the -o argument and the command's key.
func buildOutput(dir, name string, args []string) (out, key string) {
	rest := []string{filepath.Base(name), dir}
	for i := 0; i < len(args); i++ {
		if args[i] == "-o" && i+1 < len(args) {
			out = args[i+1]
			i++
			continue
		}
		rest = append(rest, args[i])
	}
	h := sha256.Sum256([]byte(strings.Join(rest, "\x00")))
	return out, filepath.Base(name) + "-" + hex.EncodeToString(h[:6])
}

func copyExec(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	// Written aside and renamed: two tests may keep the same program.
	o, err := os.CreateTemp(filepath.Dir(to), ".copy-*")
	if err != nil {
		return err
	}
	defer os.Remove(o.Name())
	if _, err := io.Copy(o, in); err != nil {
		o.Close()
		return err
	}
	if err := o.Chmod(0o755); err != nil {
		o.Close()
		return err
	}
	if err := o.Close(); err != nil {
		return err
	}
	return os.Rename(o.Name(), to)
}

// CrossBuild builds, for arch (arm64), what BuildIn(keyDir, name,
// args...) would take prebuilt, running the command in dir, into pre: Go
// programs with GOARCH and without cgo, C ones with the cross compiler and
// static (an emulated guest has no loader or libraries of that
// architecture).
func CrossBuild(pre, arch, keyDir, dir, name string, args ...string) error {
	out, key := buildOutput(keyDir, name, args)
	if out == "" {
		return fmt.Errorf("%s %v: no -o", name, args)
	}
	dst, err := filepath.Abs(filepath.Join(pre, key))
	if err != nil {
		return err
	}
	cross := make([]string, len(args))
	copy(cross, args)
	for i := range cross {
		if cross[i] == "-o" && i+1 < len(cross) {
			cross[i+1] = dst
		}
	}
	cmd := exec.Command(name, cross...)
	cmd.Dir = dir
	switch filepath.Base(name) {
	case "go":
		cmd.Env = append(os.Environ(), "GOARCH="+arch, "CGO_ENABLED=0")
	case "gcc", "cc":
		gcc := map[string]string{"arm64": "aarch64-linux-gnu-gcc"}[arch]
		if gcc == "" {
			return fmt.Errorf("no C cross compiler known for %s", arch)
		}
		cmd = exec.Command(gcc, append([]string{"-static"}, cross...)...)
		cmd.Dir = dir
	default:
		return fmt.Errorf("%s: not a build command CrossBuild knows", name)
	}
	if err := os.MkdirAll(pre, 0o755); err != nil {
		return err
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %v for %s: %v\n%s", name, args, arch, err, b)
	}
	return nil
}
