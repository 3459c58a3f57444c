// Package filelock takes exclusive locks on files, so that of the
// processes sharing a directory (two servers pointed at one data
// directory, two replicas at one artifact store) only one writes what two
// would corrupt. A lock belongs to the open file: closing it, or the
// process's end, releases it.
package filelock

import "errors"

// ErrHeld is returned by Exclusive when another open file holds the lock.
var ErrHeld = errors.New("held by another process")
