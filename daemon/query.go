package daemon

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/ctldoc"
	"github.com/bypassd/bypassd/internal/ctlproto"
)

// queryFunc builds a QUERY topic's document for the caller (the session asking).
type queryFunc func(d *Daemon, caller *session) (any, error)

// queryTopics are the topics QUERY answers. A feature adds its topic here
// with a function in its own file.
func queryTopics() map[string]queryFunc {
	return map[string]queryFunc{
		ctldoc.TopicTopics:      (*Daemon).queryTopicList,
		ctldoc.TopicRings:       (*Daemon).queryRings,
		ctldoc.TopicSessions:    (*Daemon).querySessions,
		ctldoc.TopicFlows:       (*Daemon).queryFlows,
		ctldoc.TopicDevices:     (*Daemon).queryDevices,
		ctldoc.TopicRates:       (*Daemon).queryRates,
		ctldoc.TopicQoS:         (*Daemon).queryQoS,
		ctldoc.TopicConnections: (*Daemon).queryConnections,
	}
}

// onQuery serves QUERY (bypassctl): the document goes back in a sealed
// memfd, so its size is not bounded by the control packet.
func (s *session) onQuery(h ctlproto.Header, m *ctlproto.Query) bool {
	fn, ok := queryTopics()[m.Topic]
	if !ok {
		return s.fail(h, fmt.Errorf("query %q: no such topic (ask for %q): %w", m.Topic, ctldoc.TopicTopics, unix.ENOENT))
	}
	doc, err := fn(s.d, s)
	if err != nil {
		return s.fail(h, fmt.Errorf("query %s: %w", m.Topic, err))
	}
	fd, size, err := ctlproto.WriteDocument(doc)
	if err != nil {
		s.log.Warn("query document not sent", zap.String("topic", m.Topic), zap.Error(err))
		return s.fail(h, fmt.Errorf("query %s: %w: %w", m.Topic, err, unix.ENOMEM))
	}
	defer unix.Close(fd)
	return s.reply(ctlproto.ReplyHeader(h), ctlproto.QueryReply{Size: size}, fd)
}

func (d *Daemon) queryTopicList(*session) (any, error) {
	var doc ctldoc.TopicsDoc
	for t := range queryTopics() {
		doc.Topics = append(doc.Topics, t)
	}
	slices.Sort(doc.Topics)
	return doc, nil
}

func (d *Daemon) queryRings(*session) (any, error) {
	doc := ctldoc.RingsDoc{Rings: []ctldoc.RingDoc{}}
	for i, ri := range d.rings {
		r := ri.ring()
		caps := r.Caps()
		name, queue := r.Interface()
		rd := ctldoc.RingDoc{
			Index: i, Interface: name, Queue: queue, Ifindex: r.Ifindex(),
			Provider: caps.Provider, Mode: caps.Mode, ZeroCopy: caps.ZeroCopy,
			FrameSize: caps.FrameSize, RXFrames: caps.RXFrames, TXFrames: caps.TXFrames,
			Sockets: r.Endpoints(), State: "running",
			RXPackets: r.Stats().RXPackets.Load(), TXPackets: r.Stats().TXPackets.Load(),
			CPUs: append([]int{}, ri.cfg.CPUs...), HandedOff: r.Stats().RXHandedOff.Load(),
			HandoffIn: r.Stats().RXHandoffIn.Load(), HandoffDropped: r.Stats().RXHandoffDropped.Load(),
		}
		if p := r.Program(); p != nil {
			rd.XDPMode = p.Mode().String()
			if err := p.FallbackReason(); err != nil {
				rd.XDPFallback = err.Error()
			}
		}
		select {
		case <-r.Done():
			rd.State = "stopped"
			if err := r.Err(); err != nil {
				rd.State = "stopped: " + err.Error()
			}
		default:
		}
		doc.Rings = append(doc.Rings, rd)
	}
	return doc, nil
}

// querySessions lists the sessions the caller may see: every one for root
// and the daemon's user, those of the caller's uid otherwise (as ss -p
// shows other users' processes to root only).
func (d *Daemon) querySessions(caller *session) (any, error) {
	doc := ctldoc.SessionsDoc{Sessions: []ctldoc.SessionDoc{}}
	d.mu.Lock()
	sessions := make([]*session, 0, len(d.sessions))
	for s := range d.sessions {
		if caller.isAdmin() || s.cred.Uid == caller.cred.Uid {
			sessions = append(sessions, s)
		}
	}
	d.mu.Unlock()
	for _, s := range sessions {
		doc.Sessions = append(doc.Sessions, s.describe(d))
	}
	slices.SortFunc(doc.Sessions, func(a, b ctldoc.SessionDoc) int { return int(a.PID - b.PID) })
	return doc, nil
}

// describe renders the session for QUERY sessions (sessions before HELLO
// have no program name yet).
func (s *session) describe(d *Daemon) ctldoc.SessionDoc {
	s.pub.Lock()
	defer s.pub.Unlock()
	sd := ctldoc.SessionDoc{PID: s.cred.Pid, UID: s.cred.Uid, GID: s.cred.Gid, Program: s.program, Sockets: []ctldoc.SocketDoc{}}
	for _, k := range s.sockets {
		kd := ctldoc.SocketDoc{ID: k.id, Family: "inet", Ring: slices.Index(d.rings, k.home)}
		if k.family == unix.AF_INET6 {
			kd.Family = "inet6"
		}
		if k.ep != nil {
			kd.Local = k.ep.LocalAddr().String()
			if p := k.ep.Peer(); p.IsValid() {
				kd.Peer = p.String()
			}
			kd.Broken = k.ep.Broken()
			kd.RXPackets = k.ep.Stats().RXPackets.Load()
			kd.TXPackets = k.ep.Stats().TXPackets.Load()
		}
		sd.Sockets = append(sd.Sockets, kd)
	}
	slices.SortFunc(sd.Sockets, func(a, b ctldoc.SocketDoc) int { return int(a.ID) - int(b.ID) })
	return sd
}

func (d *Daemon) queryFlows(*session) (any, error) {
	doc := ctldoc.FlowsDoc{Flows: []ctldoc.FlowDoc{}}
	var errs []error
	for _, ri := range d.rings {
		flows, err := ri.ring().Flows()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ri.it, err))
			continue
		}
		name, queue := ri.ring().Interface()
		for _, f := range flows {
			fd := ctldoc.FlowDoc{Interface: name, Proto: "udp", Dst: f.Dst.String(), Queue: uint32(queue), VNI: f.VNI, VXLANPort: f.VXLANPort}
			if f.Proto != unix.IPPROTO_UDP {
				fd.Proto = fmt.Sprint(f.Proto)
			}
			if f.Src.IsValid() {
				fd.Src = f.Src.String()
			}
			doc.Flows = append(doc.Flows, fd)
		}
	}
	if len(doc.Flows) == 0 && len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	slices.SortFunc(doc.Flows, func(a, b ctldoc.FlowDoc) int {
		if a.Interface != b.Interface {
			return strings.Compare(a.Interface, b.Interface)
		}
		if a.Dst != b.Dst {
			return strings.Compare(a.Dst, b.Dst)
		}
		return strings.Compare(a.Src, b.Src)
	})
	return doc, nil
}
