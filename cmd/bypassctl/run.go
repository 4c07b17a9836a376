package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/bypassd/bypassd/internal/ctlproto"
)

func init() {
	register(command{
		name: "run", args: "[--lib PATH] [--require] -- CMD [ARGS]",
		help: "run CMD with its UDP sockets through bypassd (LD_PRELOAD=libbypassd.so, docs/preload.md)",
		run:  runPreloaded,
	})
}

// libDirs are where run looks for libbypassd.so after the directory of
// the bypassctl binary (where `make build` puts both).
var libDirs = []string{"/usr/local/lib/bypassd", "/usr/lib/bypassd"}

const libName = "libbypassd.so"

func runPreloaded(o *options, args []string, _ io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	lib := fs.String("lib", "", "the library (default: "+libName+" beside bypassctl, then in "+strings.Join(libDirs, ", ")+")")
	require := fs.Bool("require", false, "fail socket calls that cannot be offloaded instead of using the kernel (BYPASSD_REQUIRE=1)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	argv := fs.Args()
	if len(argv) == 0 {
		return errors.New("run needs a command: bypassctl run -- CMD [ARGS]")
	}
	path := *lib
	if path == "" {
		var err error
		if path, err = findLib(); err != nil {
			return err
		}
	}
	path, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("the preload library: %w (build it with `make build`, or give --lib)", err)
	}
	bin, err := exec.LookPath(argv[0])
	if err != nil {
		return err
	}
	env := preloadEnv(os.Environ(), path, o.socket, *require)
	return fmt.Errorf("run %s: %w", bin, syscall.Exec(bin, argv, env))
}

func findLib() (string, error) {
	dirs := libDirs
	if exe, err := os.Executable(); err == nil {
		dirs = append([]string{filepath.Dir(exe)}, dirs...)
	}
	for _, d := range dirs {
		p := filepath.Join(d, libName)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found in %s: build it with `make build`, or give --lib PATH", libName, strings.Join(dirs, ", "))
}

// preloadEnv returns environ with the library first in LD_PRELOAD (ahead
// of what was there), the control socket and, if asked, BYPASSD_REQUIRE.
func preloadEnv(environ []string, lib, socket string, require bool) []string {
	out := make([]string, 0, len(environ)+3)
	preload := lib
	for _, kv := range environ {
		switch {
		case strings.HasPrefix(kv, "LD_PRELOAD="):
			if old := strings.TrimPrefix(kv, "LD_PRELOAD="); old != "" {
				preload += ":" + old
			}
		case strings.HasPrefix(kv, ctlproto.EnvSocket+"="), require && strings.HasPrefix(kv, "BYPASSD_REQUIRE="):
		default:
			out = append(out, kv)
		}
	}
	out = append(out, "LD_PRELOAD="+preload, ctlproto.EnvSocket+"="+socket)
	if require {
		out = append(out, "BYPASSD_REQUIRE=1")
	}
	return out
}
