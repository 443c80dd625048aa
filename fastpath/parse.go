package fastpath

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
)

// FieldError is an invalid value of one named input: Field is the
// caller's name for it (a flag such as "--vip[0]", a config key), Msg what
// it must be and what it got. errors.Is(err, ErrInvalid) holds, so callers
// branch on the type and name their own inputs instead of rewriting text.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// Is makes a FieldError match ErrInvalid.
func (e *FieldError) Is(target error) bool { return target == ErrInvalid }

// ParseServices parses VIP:port strings (IPv4, port > 0, no duplicates, at
// most MaxServices). Each bad entry is a *FieldError named field[i]; all
// of them are returned, joined.
func ParseServices(field string, list []string) ([]Service, error) {
	var errs []error
	out := make([]Service, 0, len(list))
	seen := make(map[Service]int, len(list))
	for i, s := range list {
		name := field + "[" + strconv.Itoa(i) + "]"
		a, err := netip.ParseAddrPort(s)
		if err != nil || validService(a) != nil {
			errs = append(errs, &FieldError{name, fmt.Sprintf("must be an IPv4 VIP:port with port > 0, got %q", s)})
			continue
		}
		if j, dup := seen[a]; dup {
			errs = append(errs, &FieldError{name, fmt.Sprintf("%q duplicates %s[%d]", s, field, j)})
			continue
		}
		seen[a] = i
		out = append(out, a)
	}
	if len(list) > MaxServices {
		errs = append(errs, &FieldError{field, fmt.Sprintf("at most %d, got %d", MaxServices, len(list))})
	}
	return out, errors.Join(errs...)
}

// ParseAttachMode parses an XDP attach mode; a bad one is a *FieldError
// named field.
func ParseAttachMode(field, s string) (AttachMode, error) {
	switch m := AttachMode(s); m {
	case AttachAuto, AttachDriver, AttachGeneric:
		return m, nil
	}
	return "", &FieldError{field, fmt.Sprintf(`must be "auto", "driver" or "generic", got %q`, s)}
}
