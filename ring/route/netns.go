package route

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// inNS runs fn with the calling OS thread inside network namespace ns, so
// that sockets fn creates belong to ns. A closed handle (netns.None()) means
// the current namespace and runs fn directly.
//
// fn runs on a dedicated goroutine: if switching back fails, that goroutine
// exits with its thread still locked, and the Go runtime then destroys the
// thread instead of reusing it in the wrong namespace. The caller's own
// thread is never switched.
func inNS(ns netns.NsHandle, fn func() error) error {
	if !ns.IsOpen() {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("route: read current network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			// setns failed, so the thread is still where it was.
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("route: enter network namespace %s: %w", ns, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			// Keep the thread locked: it dies with this goroutine.
			errc <- ferr
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
