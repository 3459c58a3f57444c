package httpapi

import (
	"net/http"

	"github.com/arbiter-hq/arbiter"
)

func (s *Server) handleWhoami(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	if err := srvOnlyParams(r.URL.Query()); err != nil {
		return err
	}
	auth := "bearer"
	switch {
	case s.open:
		auth = "open"
	case r.Header.Get("Authorization") == "":
		auth = "cookie"
	}
	srvWriteJSON(w, http.StatusOK, arbiter.Whoami{Name: c.Name, Role: c.Role, Auth: auth})
	return nil
}
