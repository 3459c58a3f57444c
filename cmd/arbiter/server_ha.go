package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/config"
	"github.com/arbiter-hq/arbiter/connlimit"
	"github.com/arbiter-hq/arbiter/forward"
	"github.com/arbiter-hq/arbiter/httpapi"
	"github.com/arbiter-hq/arbiter/leader"
	"github.com/arbiter-hq/arbiter/postgres"
	"github.com/arbiter-hq/arbiter/spalloc"
)

// A replica of a highly available deployment ([ha] enabled;
// docs/guides/high-availability.md). The process holds what outlives a
// term — the listeners, the database, the elector, the follower's proxy —
// and, for each term it leads, a serverMain of its own over the store
// fenced by that term (openTerm: the loop loads the state, then the
// webhooks, the power controller, the spalloc server and the API run). Its
// HTTP handler serves from that term while the elector trusts it, and
// forwards to the leader otherwise; a term that ends (stepped down) is
// closed whole, its requests in flight cancelled, and a later term starts
// afresh from the store.
type replica struct {
	m      *serverMain
	member arbiter.Replica
	proxy  *forward.Proxy
	// term is the term this replica leads, nil while it follows.
	term atomic.Pointer[ledTerm]
	// cfg is the configuration as last read: each term reads the file
	// again (elector's goroutine only).
	cfg *config.Config
	// metrics is a follower's /metrics.
	metrics http.Handler
	// sw hands the spalloc port's connections over (nil without one).
	sw   *forward.Switch
	swLn net.Listener
	// probe looks at the leader from outside (server_ha_probe.go) until
	// stopProbe; probeDone closes when it has stopped.
	probe     *leaderProbe
	stopProbe context.CancelFunc
	probeDone chan struct{}
}

// ledTerm is one term this replica leads.
type ledTerm struct {
	n       int64
	srv     *serverMain // its control plane
	handler http.Handler
	spalloc *forward.ChanListener // where its spalloc server takes connections
	ctx     context.Context       // ends with the term: its requests in flight end
	cancel  context.CancelFunc
}

// openReplica opens the database, joins the roster (a node id in use by a
// live replica is refused) and binds the listeners; Run campaigns.
func (m *serverMain) openReplica(ctx context.Context) error {
	h := &m.cfg.HA
	m.noLocal = true // every replica's host would come and go with its terms: run agents instead
	ttl := durationS(h.LeaseTTLS)
	_, target := m.cfg.Server.DatabaseTarget()
	pg, err := postgres.Open(ctx, target, postgres.Options{IdleInTransaction: ttl})
	if err != nil {
		return fmt.Errorf("open database: %w", err)
	}
	m.pg = pg
	host, _ := os.Hostname()
	var inst [8]byte
	rand.Read(inst[:])
	r := &replica{m: m, cfg: m.cfg, member: arbiter.Replica{ID: h.NodeID, Instance: hex.EncodeToString(inst[:]), URL: h.AdvertiseURL,
		Spalloc: m.cfg.SpallocAdvertised(), Host: host, PID: os.Getpid(), Version: version}}
	m.elector = leader.New(leader.Config{ID: h.NodeID, URL: h.AdvertiseURL, Lease: pg, Roster: pg, Member: r.member,
		TTL: ttl, Renew: durationS(h.Renew()), Logger: m.log.With("node_id", h.NodeID), Lead: r.lead, StepDown: r.stepDown})
	if err := m.elector.Join(ctx); err != nil {
		return fmt.Errorf("join the replicas: %w", err)
	}
	m.ha = r
	tc, err := m.cfg.Server.ReplicaTLS()
	if err != nil {
		return err
	}
	transport := forward.NewTransport(tc, true)
	r.proxy = forward.NewProxy(forward.ProxyOptions{Leader: m.elector.Leader, Secret: h.Secret, Self: h.NodeID,
		Unreachable: m.elector.Poke, RetryAfter: max(durationS(h.Renew()), time.Second), Transport: transport, Logger: m.log,
		Down: func(url string) bool { return r.probe.Down(url) }})
	r.probe = &leaderProbe{client: &http.Client{Transport: transport}, log: m.log.Warn, grace: 2 * ttl}
	cas, err := m.cfg.Server.ClientCAPool()
	if err != nil {
		return err
	}
	m.http = m.newHTTPServer(forward.Accept(forward.AcceptOptions{Secret: h.Secret, ClientCAs: cas, Logger: m.log}, http.HandlerFunc(r.serveHTTP)))
	forward.ServeReplicas(m.http, m.tls) // followers' requests share a few HTTP/2 connections
	r.metrics = httpapi.ReplicaMetrics(m.elector.Stats).Handler()
	if addr := m.cfg.Server.SpallocListen; addr != "" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("spalloc listen: %w", err)
		}
		r.swLn = connlimit.Logged(ln, m.cfg.Spalloc.MaxConnsPerClient, m.log, "spalloc")
		r.sw = forward.NewSwitch(forward.SwitchOptions{Secret: h.Secret, Leading: r.spallocLeading, Leader: r.spallocLeader, Logger: m.log,
			Allowed: spalloc.NewServer(spalloc.ServerOptions{Allow: m.cfg.Spalloc.AllowPrefixes}).Allowed})
	}
	m.log.Info("arbiter replica ready: following until it leads", "node_id", h.NodeID, "url", m.URL(), "advertise_url", h.AdvertiseURL,
		"lease_ttl", ttl, "renew", durationS(h.Renew()), "version", version)
	return nil
}

// runReplica starts campaigning, and the spalloc port.
func (m *serverMain) runReplica() {
	r := m.ha
	m.startElector() // server.go
	ctx, cancel := context.WithCancel(context.Background())
	r.stopProbe, r.probeDone = cancel, make(chan struct{})
	go func() {
		defer close(r.probeDone)
		r.probe.run(ctx, m.elector.Cluster)
	}()
	if r.sw != nil {
		go func() {
			if err := r.sw.Serve(r.swLn); err != nil {
				m.log.Error("spalloc port stopped", "err", err)
			}
		}()
	}
}

// closeReplica steps down (the term's last batch is committed before the
// lease is given back), leaves the roster and closes the spalloc port.
func (m *serverMain) closeReplica() {
	r := m.ha
	if r == nil {
		return
	}
	if r.stopProbe != nil {
		r.stopProbe()
		<-r.probeDone
	}
	if m.stopElector != nil {
		m.endElector() // server.go
	} else {
		// Open failed after joining: leave at once rather than when stale.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = m.pg.LeaveReplicas(ctx, r.member)
		cancel()
	}
	if r.sw != nil {
		r.sw.Close()
	} else if r.swLn != nil {
		r.swLn.Close()
	}
	m.ha = nil
}

// lead starts leading term: the configuration read again (a follower may
// have been started long ago: tokens revoked since must not come back),
// then a control plane over the store fenced by the term, which loads the
// state the last leader left.
func (r *replica) lead(ctx context.Context, term int64) error {
	m := r.m
	cfg := r.cfg
	if m.cfg.Path != "" {
		if c, err := m.rereadConfig(); err != nil {
			m.log.Error("the configuration does not load; this term uses the one read last", "err", err)
		} else {
			r.cfg, cfg = c, c
		}
	}
	cfg.HA = m.cfg.HA // node id, URLs and secret are the process's
	e := m.elector
	t := &serverMain{env: m.env, cfg: cfg, noLocal: true, log: m.log.With("term", term), detect: m.detect, now: m.now,
		advertise: m.cfg.HA.AdvertiseURL, elector: e, applyFlags: m.applyFlags, leaderProblem: r.probe.Problem}
	t.grid.power = m.grid.power
	t.store = m.pg.Fenced(postgres.Fence{Term: term, Timeout: e.TTL(),
		Trusted: func() error { return e.Trusted(term) }, Lost: func(err error) { e.Lost(term, err) }})
	var sp *forward.ChanListener
	if r.sw != nil {
		sp = forward.NewChanListener(r.swLn.Addr())
		t.spallocLn = sp
	}
	start := time.Now()
	if err := t.openTerm(ctx); err != nil {
		t.closeTerm()
		return err
	}
	tctx, cancel := context.WithCancel(context.Background())
	r.term.Store(&ledTerm{n: term, srv: t, handler: t.api.Handler(), spalloc: sp, ctx: tctx, cancel: cancel})
	m.log.Info("leading: the state is loaded and this replica serves", "term", term, "loaded_in", time.Since(start).Round(time.Millisecond))
	return nil
}

// stepDown ends term: its requests in flight are cancelled, then its
// control plane is closed (nothing it does can commit any more: the
// elector no longer trusts the term, and the store is fenced).
func (r *replica) stepDown(term int64, why error) {
	t := r.term.Load()
	if t == nil || t.n != term {
		return
	}
	r.term.Store(nil)
	t.cancel()
	t.srv.shutTerm() // not closeTerm: a reload of this term may still read its fields
	r.m.log.Warn("stepped down; following", "term", term, "why", why)
}

// serveHTTP serves a request from the term this replica leads, while the
// elector trusts it; otherwise health and metrics are this replica's own,
// and everything else goes to the leader.
func (r *replica) serveHTTP(w http.ResponseWriter, req *http.Request) {
	if t := r.leading(); t != nil {
		// The term's end cancels the request: a long-poll or an event
		// stream of a term that is over must not go on answering.
		ctx, cancel := context.WithCancel(req.Context())
		defer cancel()
		defer context.AfterFunc(t.ctx, cancel)()
		t.handler.ServeHTTP(w, req.WithContext(ctx))
		return
	}
	if req.Method == http.MethodGet || req.Method == http.MethodHead {
		switch req.URL.Path {
		case "/api/v1/health":
			c := r.m.elector.Cluster()
			httpapi.WriteHealth(w, httpapi.Health{Version: version, Cluster: &c, Problem: r.probe.Problem()})
			return
		case "/metrics":
			r.metrics.ServeHTTP(w, req)
			return
		}
	}
	r.proxy.ServeHTTP(w, req)
}

// leading is the term led, while the elector trusts it.
func (r *replica) leading() *ledTerm {
	t := r.term.Load()
	if t == nil || r.m.elector.Trusted(t.n) != nil {
		return nil
	}
	return t
}

func (r *replica) spallocLeading() *forward.ChanListener {
	if t := r.leading(); t != nil {
		return t.spalloc
	}
	return nil
}

// spallocLeader is the leader's advertised spalloc address ("" when
// there is no leader, or it has no spalloc port).
func (r *replica) spallocLeader() string {
	c := r.m.elector.Cluster()
	for _, x := range c.Replicas {
		if x.ID == c.LeaderID && c.LeaderID != "" {
			return x.Spalloc
		}
	}
	return ""
}

// reloadTarget is who a SIGHUP reloads: the server, or a replica's term;
// nil for a follower (it reads the file when it next leads).
func (m *serverMain) reloadTarget() *serverMain {
	if m.ha == nil {
		return m
	}
	if t := m.ha.term.Load(); t != nil {
		return t.srv
	}
	return nil
}

// checkConfig reads the configuration again without applying it: a
// follower's SIGHUP, so that a mistake shows now, not at a failover.
func (m *serverMain) checkConfig() error {
	if m.cfg.Path == "" {
		return nil
	}
	_, err := m.rereadConfig()
	return err
}
