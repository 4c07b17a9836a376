package main

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/bypassd/bypassd/stats"
)

// A host can hold 100,000 sockets: a per-socket view of all of them is a
// wall of text nobody reads, and formatting it costs more than reading
// the files. Past autoLimit sockets (or clients), a view shows the autoTop
// most active ones and says how to see the others (--all, --limit and
// --page, -s); the totals lines cover everything.
const (
	autoLimit = 100
	autoTop   = 20
)

// Sort orders of --sort.
const (
	sortID       = "id"
	sortActivity = "activity"
)

// paging is how a list is cut: sorted by activity or not, then one page
// of limit items (limit 0: all).
type paging struct {
	byActivity  bool
	limit, page int
	auto        bool // the automatic summary cut
}

// paging decides how to cut a list of n items. filtered: -s chose the
// sockets already, so nothing is cut automatically.
func (o *options) paging(n int, filtered bool) paging {
	p := paging{byActivity: o.sort == sortActivity, limit: o.limit, page: max(o.page, 1)}
	if o.all {
		return paging{byActivity: p.byActivity, page: 1}
	}
	if p.limit == 0 && o.page > 0 {
		p.limit = autoLimit
	}
	if p.limit == 0 && !filtered && o.sort == "" && n > autoLimit {
		p = paging{byActivity: true, limit: autoTop, page: 1, auto: true}
	}
	return p
}

// cut sorts items (by activity when asked: most active first, ties in
// their original order) and returns the page, with a note saying what was
// left out ("" when nothing was). what names the items ("socket").
func cut[T any](items []T, p paging, activity func(T) uint64, what string) ([]T, string) {
	n := len(items)
	if p.byActivity {
		slices.SortStableFunc(items, func(a, b T) int { return cmp.Compare(activity(b), activity(a)) })
	}
	if p.limit <= 0 || n <= p.limit && p.page == 1 {
		return items, ""
	}
	pages := (n + p.limit - 1) / p.limit
	from := min((p.page-1)*p.limit, n)
	to := min(from+p.limit, n)
	if p.auto {
		return items[from:to], fmt.Sprintf("the %d most active of %s (--all for every one, --limit N --page P to page through them, --sort id for id order)",
			to-from, plural(n, what))
	}
	if from == to {
		return nil, fmt.Sprintf("page %d of %d is empty: %s, %d per page", p.page, pages, plural(n, what), p.limit)
	}
	return items[from:to], fmt.Sprintf("%ss %d-%d of %d (page %d of %d)", what, from+1, to, n, p.page, pages)
}

// listed is a socket to show and the client file it is in.
type listed struct {
	s *stats.Socket
	c *stats.Snapshot
}

// socketActivity is what --sort activity orders by (stats.SocketActivity).
func socketActivity(c *stats.SocketCounters) uint64 {
	return stats.SocketActivity(func(x stats.SocketCounter) uint64 { return c[x] })
}

// shown returns the sockets of clients a per-socket view prints (-s, then
// --sort, then the page) and the note about the others.
func (v *viewer) shown(clients []*stats.Snapshot) ([]listed, string) {
	var all []listed
	for _, c := range clients {
		for i := range c.Sockets {
			if s := &c.Sockets[i]; v.o.sockets.match(s.ID) {
				all = append(all, listed{s: s, c: c})
			}
		}
	}
	activity := func(l listed) uint64 {
		if v.deltas() && !v.t.isDaemon() {
			// Rates: the busiest now, not the busiest ever.
			return stats.SocketActivity(func(x stats.SocketCounter) uint64 { return v.sock(l.s, x) })
		}
		return socketActivity(&l.s.Counters)
	}
	return cut(all, v.o.paging(len(all), len(v.o.sockets) > 0), activity, "socket")
}
