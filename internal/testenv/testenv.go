// Package testenv holds helpers shared by the project's tests.
package testenv

import (
	"os"
	"testing"
)

// RequireRoot skips a test that needs root for eBPF, unless
// OFFCPU_REQUIRE_BPF=1 says this machine must run it (CI does).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("OFFCPU_REQUIRE_BPF") == "1" {
		t.Fatal("OFFCPU_REQUIRE_BPF=1 but not running as root: run the tests as root")
	}
	t.Skip("needs root for eBPF (set OFFCPU_REQUIRE_BPF=1 to make this a failure)")
}
