package sqlite

import (
	"path/filepath"
	"testing"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/storetest"
)

func TestDeliveries(t *testing.T) {
	storetest.ExerciseDeliveries(t, func(t *testing.T) func() arbiter.Store {
		path := filepath.Join(t.TempDir(), "arbiter.db")
		return func() arbiter.Store {
			s, err := Open(path, Options{})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			return s
		}
	})
}
