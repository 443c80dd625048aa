package fastpath

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestParseServices(t *testing.T) {
	tests := []struct {
		name   string
		list   []string
		want   []Service
		fields []string // the FieldErrors' names, in order
		msg    string   // the whole message
	}{
		{name: "ok", list: []string{"10.100.0.1:8000", "10.100.0.2:80"},
			want: []Service{netip.MustParseAddrPort("10.100.0.1:8000"), netip.MustParseAddrPort("10.100.0.2:80")}},
		{name: "no port", list: []string{"10.100.0.1"}, fields: []string{"--vip[0]"},
			msg: `--vip[0]: must be an IPv4 VIP:port with port > 0, got "10.100.0.1"`},
		{name: "ipv6 and port 0", list: []string{"[::1]:80", "10.0.0.1:0"}, fields: []string{"--vip[0]", "--vip[1]"},
			msg: "--vip[0]: must be an IPv4 VIP:port with port > 0, got \"[::1]:80\"\n--vip[1]: must be an IPv4 VIP:port with port > 0, got \"10.0.0.1:0\""},
		{name: "duplicate", list: []string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.1:80"}, fields: []string{"--vip[2]"},
			want: []Service{netip.MustParseAddrPort("10.0.0.1:80"), netip.MustParseAddrPort("10.0.0.2:80")},
			msg:  `--vip[2]: "10.0.0.1:80" duplicates --vip[0]`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseServices("--vip", tc.list)
			if tc.want != nil && !slices.Equal(got, tc.want) {
				t.Errorf("services %v, want %v", got, tc.want)
			}
			if tc.msg == "" {
				if err != nil {
					t.Fatalf("err %v", err)
				}
				return
			}
			if err == nil || err.Error() != tc.msg {
				t.Fatalf("err %q, want %q", err, tc.msg)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%v is not ErrInvalid", err)
			}
			var fields []string
			for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
				var fe *FieldError
				if !errors.As(e, &fe) {
					t.Fatalf("%v (%T) is not a *FieldError", e, e)
				}
				fields = append(fields, fe.Field)
			}
			if !slices.Equal(fields, tc.fields) {
				t.Errorf("fields %v, want %v", fields, tc.fields)
			}
		})
	}
	t.Run("too many", func(t *testing.T) {
		var list []string
		for i := range MaxServices + 1 {
			list = append(list, fmt.Sprintf("10.0.0.1:%d", 1000+i))
		}
		_, err := ParseServices("svc", list)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "svc" || !strings.Contains(fe.Msg, "at most 64") {
			t.Fatalf("err %v", err)
		}
	})
}

func TestParseAttachMode(t *testing.T) {
	for _, s := range []string{"auto", "driver", "generic"} {
		if m, err := ParseAttachMode("a", s); err != nil || string(m) != s {
			t.Errorf("%s: %v %v", s, m, err)
		}
	}
	_, err := ParseAttachMode("--attach", "skb")
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "--attach" || !errors.Is(err, ErrInvalid) {
		t.Fatalf("err %v", err)
	}
}
