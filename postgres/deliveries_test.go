package postgres

import (
	"testing"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/storetest"
)

func TestDeliveries(t *testing.T) {
	url := testURL(t)
	storetest.ExerciseDeliveries(t, func(t *testing.T) func() arbiter.Store {
		schema := newSchema(t, url)
		return func() arbiter.Store {
			s, err := Open(t.Context(), url, Options{Schema: schema})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			return s
		}
	})
}
