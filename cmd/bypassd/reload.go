package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"

	"go.uber.org/zap"
)

// The reload path of a live upgrade: SIGHUP (the unit's ExecReload) makes
// the daemon start the binary now installed at its path with its own
// arguments plus --takeover; that process takes everything over and this
// one exits. The successor tells systemd it is the main process now
// (sd_notify MAINPID), so the unit lives on.

// executable is the path this daemon was started from, resolved at start:
// after an upgrade it names the new binary (the old one keeps running from
// its deleted inode, which /proc/self/exe would name).
func executable() (string, error) {
	exe := os.Args[0]
	if filepath.Base(exe) == exe {
		p, err := exec.LookPath(exe)
		if err != nil {
			return "", err
		}
		exe = p
	}
	return filepath.Abs(exe)
}

// startSuccessor starts exe with args and --takeover; its output goes
// where ours does. A successor that fails is logged; until it took over,
// this daemon serves on.
func startSuccessor(exe string, args []string, log *zap.Logger) {
	args = slices.DeleteFunc(slices.Clone(args), func(a string) bool { return a == "--takeover" || a == "-takeover" })
	cmd := exec.Command(exe, append(args, "--takeover")...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		log.Error("reload: cannot start the new daemon; serving on", zap.String("path", exe), zap.Error(err))
		return
	}
	log.Info("reload: started the installed binary to take over", zap.String("path", exe), zap.Int("new_pid", cmd.Process.Pid))
	go func() {
		if err := cmd.Wait(); err != nil {
			log.Warn("reload: the new daemon exited", zap.Int("new_pid", cmd.Process.Pid), zap.Error(err))
		}
	}()
}

// sdNotify sends state to systemd's notification socket ($NOTIFY_SOCKET;
// nothing without it), as sd_notify(3) does.
func sdNotify(state string) error {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return nil
	}
	if path[0] == '@' {
		path = "\x00" + path[1:] // abstract namespace
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(state)); err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	return nil
}
