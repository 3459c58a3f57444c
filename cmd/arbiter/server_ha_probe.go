package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// leaderProbeEvery is how often a replica checks that the leader answers
// at its advertise_url, as the name the lease gives it (a variable for the
// tests).
var leaderProbeEvery = 5 * time.Second

// leaderProbe is a replica's look at the leader from outside: a wrong
// advertise_url, or a leader the followers cannot reach, leaves every
// request through them refused while each replica's own state looks fine.
// The leader probes its own URL too. Health reports a problem once it has
// lasted grace (Problem): a failover, over within the lease's time, is no
// reason for a load balancer to take every replica out.
type leaderProbe struct {
	client  *http.Client
	grace   time.Duration
	problem atomic.Pointer[probeProblem]
	down    atomic.Pointer[string] // the leader URL that did not answer at the last look
	log     func(msg string, args ...any)
	said    string // the problem last logged (probe's goroutine only)
}

type probeProblem struct {
	what  string
	since time.Time
}

// Problem is what the looks at the leader have found wrong for grace or
// longer, "" when nothing.
func (p *leaderProbe) Problem() string {
	if s := p.problem.Load(); s != nil && time.Since(s.since) >= p.grace {
		return s.what
	}
	return ""
}

// Down reports whether the leader at url did not answer at the last look:
// a follower then refuses requests as not applied rather than send them to
// hang on it (forward.ProxyOptions.Down).
func (p *leaderProbe) Down(url string) bool {
	d := p.down.Load()
	return d != nil && *d == url
}

// run looks at the leader named by cluster every leaderProbeEvery until
// ctx ends.
func (p *leaderProbe) run(ctx context.Context, cluster func() arbiter.Cluster) {
	t := time.NewTicker(leaderProbeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c := cluster()
		problem, down := p.check(ctx, c)
		if down {
			p.down.Store(&c.Leader)
		} else {
			p.down.Store(nil)
		}
		p.set(problem)
	}
}

func (p *leaderProbe) set(problem string) {
	switch old := p.problem.Load(); {
	case problem == "":
		p.problem.Store(nil)
	case old == nil:
		p.problem.Store(&probeProblem{problem, time.Now()})
	default:
		p.problem.Store(&probeProblem{problem, old.since}) // the same trouble, said anew
	}
	if problem != p.said {
		if problem != "" {
			p.log("the leader does not answer at its advertise_url as itself", "problem", problem)
		}
		p.said = problem
	}
}

// check asks the leader c names for its health at its URL: "" when it
// answers as itself (or none leads: a failover says so otherwise), and
// whether it did not answer at all.
func (p *leaderProbe) check(ctx context.Context, c arbiter.Cluster) (string, bool) {
	if c.Leader == "" || c.LeaderID == "" {
		return "", false
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Leader+"/api/v1/health", nil)
	if err != nil {
		return fmt.Sprintf("the leader %s advertises %q, which is not a URL: fix its [ha] advertise_url", arbiter.EscapeText(c.LeaderID, false), arbiter.Clip(c.Leader, 200)), false
	}
	resp, err := p.client.Do(req)
	if err != nil {
		if ctx.Err() != nil && ctx.Err() != context.DeadlineExceeded {
			return "", false // stopping
		}
		return fmt.Sprintf("the leader %s does not answer at its advertise_url %s (%v): requests through followers fail; check [ha] advertise_url and the network between the replicas",
			arbiter.EscapeText(c.LeaderID, false), c.Leader, err), true
	}
	defer resp.Body.Close()
	var h struct {
		NodeID string `json:"node_id"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&h); err != nil || h.NodeID != c.LeaderID {
		return fmt.Sprintf("the leader %s's advertise_url %s answers as %q, not as it: fix its [ha] advertise_url",
			arbiter.EscapeText(c.LeaderID, false), c.Leader, arbiter.EscapeText(h.NodeID, false)), false
	}
	return "", false
}
