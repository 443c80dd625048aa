//go:build !unix

package slowpath

import "errors"

// RaiseFDLimit is not supported on this system.
func RaiseFDLimit() (soft, hard uint64, err error) {
	return 0, 0, errors.New("fd limit: not supported on this system")
}

func fdSoftLimit() uint64 { return 0 }
