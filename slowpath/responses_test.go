package slowpath

import (
	"fmt"
	"testing"
)

// TestResponseStore: bounded LRU (the least recently used entry goes
// first) with a TTL counted from when the id was stored.
func TestResponseStore(t *testing.T) {
	st := newResponseStore(3, 100)
	for i := range 3 {
		st.put(fmt.Appendf(nil, "r%d", i), fmt.Sprintf("rep%d", i), int64(i))
	}
	if rep, ok := st.get([]byte("r0"), 10); !ok || rep != "rep0" { // r0 now most recent
		t.Fatalf("r0: %q %v", rep, ok)
	}
	st.put([]byte("r3"), "rep3", 11) // evicts r1, the least recently used
	if _, ok := st.get([]byte("r1"), 11); ok {
		t.Fatal("r1 not evicted")
	}
	for _, id := range []string{"r0", "r2", "r3"} {
		if _, ok := st.get([]byte(id), 12); !ok {
			t.Fatalf("%s lost", id)
		}
	}
	if st.len() != 3 {
		t.Fatalf("len %d", st.len())
	}
	st.put([]byte("r2"), "moved", 50) // re-stored: new replica, new time
	if rep, ok := st.get([]byte("r2"), 149); !ok || rep != "moved" {
		t.Fatalf("r2: %q %v", rep, ok)
	}
	if _, ok := st.get([]byte("r0"), 101); ok { // stored at 0, ttl 100
		t.Fatal("r0 outlived its TTL")
	}
	if _, ok := st.get([]byte("r2"), 151); ok {
		t.Fatal("r2 outlived its TTL")
	}
	if st.len() != 1 {
		t.Fatalf("expired entries kept: len %d", st.len())
	}
}

func TestDescribeJSON(t *testing.T) {
	tests := []struct{ body, want string }{
		{`{"a":1}`, ""},
		{` {"a":[1,2]} `, ""},
		{`{"a":`, "the body is truncated: it ends at byte 5 (line 1, column 6) inside an unfinished value."},
		{"{\"a\":1}\n{}", "trailing data after the JSON object at line 2, column 1 (byte offset 8)."},
		{`[1]`, "the body is a JSON array, not an object."},
		{`null`, "the body is a JSON null, not an object."},
		{"{\n\"a\" 1}", "invalid character '1' after object key at line 2, column 5 (byte offset 6)."},
		{`{"a":"\x"}`, `invalid character 'x' in string escape code at line 1, column 8 (byte offset 7).`},
	}
	for _, tc := range tests {
		if got := describeJSON([]byte(tc.body)); got != tc.want {
			t.Errorf("describeJSON(%q) = %q, want %q", tc.body, got, tc.want)
		}
	}
}

func TestCORSConfig(t *testing.T) {
	for _, tc := range []struct {
		origins []string
		err     string
	}{
		{[]string{"*", "https://a.example", "http://localhost:3000"}, ""},
		{[]string{"https://a.example/"}, `cors.allowed_origins[0]: must be "*" or scheme://host[:port] (http or https, no path or trailing slash), got "https://a.example/"`},
		{[]string{"*", "a.example"}, `cors.allowed_origins[1]: must be "*" or scheme://host[:port] (http or https, no path or trailing slash), got "a.example"`},
		{[]string{"ftp://a"}, `cors.allowed_origins[0]: must be "*" or scheme://host[:port] (http or https, no path or trailing slash), got "ftp://a"`},
	} {
		c := CORSConfig{AllowedOrigins: tc.origins}
		err := c.Validate()
		if (err == nil) != (tc.err == "") || (err != nil && err.Error() != tc.err) {
			t.Errorf("%v: %v, want %q", tc.origins, err, tc.err)
		}
	}
	_, err := ParseConfig([]byte("cors:\n  allowed_origins: [\"https://ok.example\"]\n  max_age: 48h\n"))
	if err == nil || err.Error() != "line 3: cors.max_age: must be in [0s, 24h], got 48h0m0s" {
		t.Fatalf("max_age: %v", err)
	}
}
