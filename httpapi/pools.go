package httpapi

import (
	"context"
	"net/http"
	"net/url"

	"github.com/arbiter-hq/arbiter"
)

// Pools (specs/pools.md): their configuration, backings and slot occupancy.

// srvPoolsBody is the answer of GET /api/v1/pools.
type srvPoolsBody struct {
	Pools []arbiter.PoolStatus `json:"pools"`
}

func (s *Server) handlePools(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := srvOnlyParams(r.URL.Query()); err != nil {
		return err
	}
	out := srvPoolsBody{Pools: []arbiter.PoolStatus{}}
	for _, rec := range s.plane.Records(arbiter.RecordPool) {
		if st, ok := rec.Value.(arbiter.PoolStatus); ok {
			out.Pools = append(out.Pools, st)
		}
	}
	srvWriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) handlePool(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := srvOnlyParams(r.URL.Query()); err != nil {
		return err
	}
	name := r.PathValue("name")
	v, ok := s.plane.Record(arbiter.RecordPool, name)
	st, isPool := v.(arbiter.PoolStatus)
	if !ok || !isPool {
		return arbiter.Errorf(arbiter.ENotFound, "pool %q is not configured", name)
	}
	srvWriteJSON(w, http.StatusOK, st)
	return nil
}

// Pools returns every pool with its backings and slot occupancy.
func (c *Client) Pools(ctx context.Context) ([]arbiter.PoolStatus, error) {
	var out srvPoolsBody
	if err := c.do(ctx, http.MethodGet, "/api/v1/pools", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Pools, nil
}

// Pool returns one pool. Errors: not_found when it is not configured.
func (c *Client) Pool(ctx context.Context, name string) (arbiter.PoolStatus, error) {
	var out arbiter.PoolStatus
	err := c.do(ctx, http.MethodGet, "/api/v1/pools/"+url.PathEscape(name), nil, nil, &out)
	return out, err
}
