package collector

import (
	"crypto/sha256"
	"encoding/hex"
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
	envPrebuilt    = "OFFCPU_PREBUILT"
	envPrebuildOut = "OFFCPU_PREBUILD_OUT"
)

func runBuild(t testing.TB, name string, args ...string) {
	t.Helper()
	out, key := buildOutput(name, args)
	if dir := os.Getenv(envPrebuilt); dir != "" && out != "" {
		if err := copyExec(filepath.Join(dir, key), out); err != nil {
			t.Fatalf("prebuilt %s %v: %v (build it on the host with %s set)", name, args, err, envPrebuildOut)
		}
		return
	}
	cmd := exec.Command(name, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	if dir := os.Getenv(envPrebuildOut); dir != "" && out != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := copyExec(out, filepath.Join(dir, key)); err != nil {
			t.Fatalf("keeping %s: %v", out, err)
		}
	}
}

// buildOutput is the -o argument and the command's key ("" if none).
func buildOutput(name string, args []string) (out, key string) {
	var rest []string
	for i := 0; i < len(args); i++ {
		if args[i] == "-o" && i+1 < len(args) {
			out = args[i+1]
			i++
			continue
		}
		rest = append(rest, args[i])
	}
	h := sha256.Sum256([]byte(filepath.Base(name) + "\x00" + strings.Join(rest, "\x00")))
	return out, filepath.Base(name) + "-" + hex.EncodeToString(h[:6])
}

func copyExec(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	o, err := os.OpenFile(to, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(o, in); err != nil {
		o.Close()
		return err
	}
	return o.Close()
}
