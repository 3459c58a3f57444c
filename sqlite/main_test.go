package sqlite

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine outlives them.
func TestMain(m *testing.M) {
	lockHolderChild() // lock_test.go
	goleak.VerifyTestMain(m)
}
