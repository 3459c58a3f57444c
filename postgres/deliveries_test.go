package postgres

import (
	"testing"

	"github.com/arbiter-hq/arbiter/storetest"
)

func TestDeliveries(t *testing.T) {
	storetest.ExerciseDeliveries(t, opener(testURL(t)))
}
