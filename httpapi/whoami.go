package httpapi

import (
	"net/http"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/httpio"
)

func (s *Server) handleWhoami(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	auth := "bearer"
	switch {
	case s.open:
		auth = "open"
	case r.Header.Get("Authorization") == "":
		auth = "cookie"
	}
	httpio.WriteJSON(w, http.StatusOK, arbiter.Whoami{Name: c.Name, Role: c.Role, Auth: auth})
	return nil
}
