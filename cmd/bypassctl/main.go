// Command bypassctl is bypassd's operator CLI: it asks a running daemon
// what it serves (rings, client sessions, steering flows, and the topics
// features add, such as the pacing rate table) and changes what may change
// at run time (the log level).
//
//	bypassctl [--socket PATH] [--json] COMMAND [ARGS]
//
// It talks to the daemon's control socket with the QUERY request
// (docs/protocol.md); the answers are JSON documents that --json prints as
// they are, for scripts.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/buildinfo"
	"github.com/bypassd/bypassd/internal/ctldoc"
	"github.com/bypassd/bypassd/internal/ctlproto"
)

// command is one bypassctl subcommand.
type command struct {
	name, args, help string
	// topic is the QUERY topic the command shows (empty: run does it all).
	topic string
	// newDoc returns the value the topic's document decodes into.
	newDoc func() any
	// print renders the decoded document for people.
	print func(w io.Writer, doc any) error
	// run serves commands that are not a plain query.
	run func(o *options, args []string, w io.Writer) error
}

// commands are registered by the file that implements each one.
var commands = map[string]command{}

func register(c command) { commands[c.name] = c }

type options struct {
	socket string
	json   bool
}

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bypassctl:", err)
		os.Exit(1)
	}
}

func run(argv []string, stdout, stderr io.Writer) error {
	var o options
	fs := flag.NewFlagSet("bypassctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.socket, "socket", ctlproto.SocketPath(), "bypassd's control socket (env "+ctlproto.EnvSocket+")")
	fs.BoolVar(&o.json, "json", false, "print the daemon's JSON document instead of a table")
	version := fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() { usage(fs, stderr) }
	if err := fs.Parse(argv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if *version {
		fmt.Fprintln(stdout, "bypassctl", buildinfo.Version())
		return nil
	}
	args := fs.Args()
	if len(args) == 0 {
		usage(fs, stderr)
		return errors.New("no command given")
	}
	c, ok := commands[args[0]]
	if !ok {
		return fmt.Errorf("unknown command %q (run bypassctl -h for the list)", args[0])
	}
	if c.run != nil {
		return c.run(&o, args[1:], stdout)
	}
	if len(args) > 1 {
		return fmt.Errorf("%s takes no arguments", c.name)
	}
	return showTopic(&o, c, stdout)
}

func usage(fs *flag.FlagSet, w io.Writer) {
	fmt.Fprintln(w, "usage: bypassctl [--socket PATH] [--json] COMMAND [ARGS]")
	fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		c := commands[n]
		fmt.Fprintf(w, "  %-22s %s\n", strings.TrimSpace(c.name+" "+c.args), c.help)
	}
	fmt.Fprintln(w, "\nflags:")
	fs.PrintDefaults()
}

// dial opens an administrative session with the daemon.
func dial(o *options) (*ctlproto.Admin, error) {
	a, err := ctlproto.DialAdmin(o.socket, "bypassctl")
	if err != nil {
		if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
			return nil, fmt.Errorf("%w (run as root or as a member of the control socket's group)", err)
		}
		return nil, err
	}
	return a, nil
}

// query fetches topic's document into v (a pointer), or into a generic
// value when v is nil, and explains a refusal.
func query(o *options, topic string, v any) error {
	a, err := dial(o)
	if err != nil {
		return err
	}
	defer a.Close()
	if err := a.Query(topic, v); err != nil {
		return queryError(topic, err)
	}
	return nil
}

func queryError(topic string, err error) error {
	var errno unix.Errno
	if errors.As(err, &errno) {
		switch errno {
		case unix.ENOENT:
			return fmt.Errorf("bypassd does not know the topic %q (bypassctl topics lists what it answers; an older daemon may lack it)", topic)
		case unix.EINVAL, unix.ENOSYS:
			return fmt.Errorf("query %s: bypassd refused the request (%v): it may be older than this bypassctl; upgrade it", topic, errno)
		case unix.EPERM, unix.EACCES:
			return fmt.Errorf("query %s: permission denied: run as root or as bypassd's user", topic)
		}
	}
	return fmt.Errorf("query %s: %w", topic, err)
}

// showTopic prints a topic's document: as JSON with --json, else as the
// command's table.
func showTopic(o *options, c command, w io.Writer) error {
	if o.json {
		var raw json.RawMessage
		if err := query(o, c.topic, &raw); err != nil {
			return err
		}
		return printJSON(w, raw)
	}
	doc := c.newDoc()
	if err := query(o, c.topic, doc); err != nil {
		return err
	}
	return c.print(w, doc)
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func init() {
	register(command{
		name: "query", args: "TOPIC", help: "print any topic's JSON document (including topics this bypassctl does not render)",
		run: func(o *options, args []string, w io.Writer) error {
			if len(args) != 1 {
				return errors.New("query takes one topic (bypassctl topics lists them)")
			}
			if err := ctlproto.CheckTopic(args[0]); err != nil {
				return err
			}
			var raw json.RawMessage
			if err := query(o, args[0], &raw); err != nil {
				return err
			}
			return printJSON(w, raw)
		},
	})
	register(command{
		name: "topics", help: "list the topics the daemon answers",
		topic: ctldoc.TopicTopics, newDoc: func() any { return new(ctldoc.TopicsDoc) },
		print: func(w io.Writer, doc any) error {
			for _, t := range doc.(*ctldoc.TopicsDoc).Topics {
				fmt.Fprintln(w, t)
			}
			return nil
		},
	})
}
