package httpapi

import (
	"context"
	"net/http/httptest"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
)

// poolPlane is the fake plane with pool status records.
type poolPlane struct {
	*fakePlane
	pools []arbiter.PoolStatus
}

func (p *poolPlane) Records(kind string) []arbiter.Record {
	if kind != arbiter.RecordPool {
		return nil
	}
	var out []arbiter.Record
	for _, st := range p.pools {
		out = append(out, arbiter.Record{Kind: kind, Key: st.Name, Value: st})
	}
	return out
}

func (p *poolPlane) Record(kind, key string) (any, bool) {
	for _, st := range p.pools {
		if kind == arbiter.RecordPool && st.Name == key {
			return st, true
		}
	}
	return nil, false
}

func poolServer(t *testing.T, pools ...arbiter.PoolStatus) *Server {
	t.Helper()
	return NewServer(Options{Plane: &poolPlane{newFakePlane(), pools}, Tokens: testTokens, Version: "test"})
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestServerPools(t *testing.T) {
	slot, release := int64(9), fakeNow.Add(time.Minute)
	st := arbiter.PoolStatus{
		Pool: arbiter.Pool{Name: "small", Backing: arbiter.Request{Owner: "pool:small", GPUs: 1, MinVRAMGiB: 40},
			Slots: 2, GraceTimeS: 60},
		Configured: true,
		Backings: []arbiter.BackingStatus{{Allocation: 4, State: arbiter.StateReady, Machine: arbiter.Str("gpu1"),
			Slots: []*int64{&slot, nil}, ReleaseAt: &release}},
	}
	s := poolServer(t, st)

	a := call(t, s, "GET", "/api/v1/pools", testUser, nil)
	var list struct {
		Pools []map[string]any `json:"pools"`
	}
	a.decode(t, &list)
	if a.status != 200 || len(list.Pools) != 1 {
		t.Fatalf("list: got %d %s, want 200 with one pool", a.status, a.body)
	}
	// The wire names (README, Pools; docs/reference/pools.md's configuration keys).
	p := list.Pools[0]
	if got, want := keys(p), []string{"backing", "backings", "configured", "grace_time_s", "max_age_s", "min_retention_s", "name", "slots"}; !reflect.DeepEqual(got, want) {
		t.Errorf("pool fields: got %v, want %v", got, want)
	}
	b := p["backings"].([]any)[0].(map[string]any)
	if got, want := keys(b), []string{"allocation", "drain_at", "draining", "machine", "release_at", "slots", "state"}; !reflect.DeepEqual(got, want) {
		t.Errorf("backing fields: got %v, want %v", got, want)
	}
	if got := b["slots"].([]any); len(got) != 2 || got[0] != float64(9) || got[1] != nil {
		t.Errorf("slots: got %v, want [9 null]", got)
	}
	if b["release_at"] != "2025-01-02T03:05:05Z" || b["drain_at"] != nil {
		t.Errorf("release_at %v drain_at %v, want an RFC 3339 UTC time and null", b["release_at"], b["drain_at"])
	}

	a = call(t, s, "GET", "/api/v1/pools/small", testAgent, nil)
	var one arbiter.PoolStatus
	a.decode(t, &one)
	if a.status != 200 || !reflect.DeepEqual(one.Backings[0].Slots, st.Backings[0].Slots) || one.Name != "small" {
		t.Errorf("one: got %d %s, want 200 and the pool", a.status, a.body)
	}

	for _, tt := range []struct {
		path, token string
		status      int
		code        string
	}{
		{"/api/v1/pools/nope", testUser, 404, arbiter.ENotFound},
		{"/api/v1/pools?name=small", testUser, 400, arbiter.EInvalid},
		{"/api/v1/pools/small?x=1", testUser, 400, arbiter.EInvalid},
		{"/api/v1/pools", "", 401, arbiter.EUnauthorized},
	} {
		a := call(t, s, "GET", tt.path, tt.token, nil)
		if code, _ := a.errorBody(t); a.status != tt.status || code != tt.code {
			t.Errorf("%s: got %d %s, want %d %s", tt.path, a.status, code, tt.status, tt.code)
		}
	}

	// No pools: an empty list, never null.
	if a := call(t, poolServer(t), "GET", "/api/v1/pools", testUser, nil); string(a.body) != "{\"pools\":[]}\n" {
		t.Errorf("no pools: got %s, want {\"pools\":[]}", a.body)
	}

	// The Go client reads both routes.
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
	c := client.New(hs.URL, testUser)
	ps, err := c.Pools(context.Background())
	if err != nil || len(ps) != 1 || ps[0].Name != "small" {
		t.Errorf("client Pools: %v %+v", err, ps)
	}
	if _, err := c.Pool(context.Background(), "nope"); arbiter.ErrorCode(err) != arbiter.ENotFound {
		t.Errorf("client Pool(nope): %v, want not_found", err)
	}
}
