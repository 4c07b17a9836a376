package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/bypassd/bypassd/internal/ctlproto"
)

func init() {
	register(command{
		name: "log-level", args: "LEVEL", help: "set the daemon's log level (debug, info, warn, error)",
		run: setLogLevel,
	})
}

func setLogLevel(o *options, args []string, w io.Writer) error {
	if len(args) != 1 {
		return errors.New("log-level takes one level: debug, info, warn or error")
	}
	level, err := ctlproto.ParseLogLevel(args[0])
	if err != nil {
		return err
	}
	a, err := dial(o)
	if err != nil {
		return err
	}
	defer a.Close()
	m, _, err := a.Call(ctlproto.Header{Code: ctlproto.CodeSetLogLevel}, ctlproto.LogLevel{Level: level})
	if err != nil {
		return ctlproto.AdminError("set bypassd's log level", err)
	}
	prev, ok := m.(*ctlproto.LogLevel)
	if !ok {
		return fmt.Errorf("set bypassd's log level: unexpected reply %T", m)
	}
	fmt.Fprintf(w, "bypassd log level: %s -> %s\n", ctlproto.LogLevelName(prev.Level), ctlproto.LogLevelName(level))
	return nil
}
