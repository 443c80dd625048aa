package main

import (
	"errors"
	"fmt"
)

// closers is a stack of cleanups for what a command started: close runs
// them last in, first out (what was started later, and may use what came
// before, stops first), each once, and joins their errors. Not safe for
// concurrent use.
type closers struct {
	list []closer
}

type closer struct {
	name string
	fn   func() error
}

// push adds fn, named for its error, on top of the stack.
func (c *closers) push(name string, fn func() error) {
	c.list = append(c.list, closer{name, fn})
}

// close runs every cleanup, the last pushed first, and empties the stack:
// a second close does nothing. Every cleanup runs even when one fails.
func (c *closers) close() error {
	var errs []error
	for i := len(c.list) - 1; i >= 0; i-- {
		if err := c.list[i].fn(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.list[i].name, err))
		}
	}
	c.list = nil
	return errors.Join(errs...)
}
