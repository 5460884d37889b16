package collector

import (
	"fmt"
	"os/exec"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// StartCommand starts cmd stopped at its exec, adds it to the session's
// targets and lets it run, so it is recorded from its first instruction.
// The session must have been started with TargetsOnly (or PIDs). The
// caller waits for cmd as usual.
func (s *Session) StartCommand(cmd *exec.Cmd) error {
	// ptrace requests must come from the thread that started the child.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Ptrace = true
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", cmd.Path, err)
	}
	pid := cmd.Process.Pid
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, 0, nil); err != nil {
		return fmt.Errorf("waiting for %s to exec: %w", cmd.Path, err)
	}
	if !ws.Stopped() {
		return fmt.Errorf("%s exited before it ran (status %v)", cmd.Path, ws)
	}
	addErr := s.AddPID(pid)
	if err := unix.PtraceDetach(pid); err != nil {
		return fmt.Errorf("releasing %s after exec: %w", cmd.Path, err)
	}
	return addErr
}
