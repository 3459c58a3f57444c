//go:build !unix

package gpu

import "errors"

func openXIDFile(string) (xidFile, error) {
	return nil, errors.New("the kernel log can only be read on Unix")
}
