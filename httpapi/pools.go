package httpapi

import (
	"net/http"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/httpio"
)

// Pools (docs/reference/pools.md): their configuration, backings and slot occupancy.

// poolsBody is the answer of GET /api/v1/pools.
type poolsBody struct {
	Pools []arbiter.PoolStatus `json:"pools"`
}

func (s *Server) handlePools(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	out := poolsBody{Pools: []arbiter.PoolStatus{}}
	for _, rec := range s.plane.Records(arbiter.RecordPool) {
		if st, ok := rec.Value.(arbiter.PoolStatus); ok {
			out.Pools = append(out.Pools, st)
		}
	}
	httpio.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) handlePool(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	name := r.PathValue("name")
	v, ok := s.plane.Record(arbiter.RecordPool, name)
	st, isPool := v.(arbiter.PoolStatus)
	if !ok || !isPool {
		return arbiter.Errorf(arbiter.ENotFound, "pool %q is not configured", name)
	}
	httpio.WriteJSON(w, http.StatusOK, st)
	return nil
}
