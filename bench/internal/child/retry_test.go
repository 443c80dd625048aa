package child

import (
	"errors"
	"testing"
)

// RetryBind repeats a start whose port was taken (warmpath's, nginx's and
// llama-server's wordings), up to three times, and no other failure.
func TestRetryBind(t *testing.T) {
	for _, msg := range []string{"listen tcp 127.0.0.1:1: bind: address already in use",
		"nginx: bind() to 127.0.0.1:1 failed (98: Address already in use)",
		"llama-server 127.0.0.1:44609 exited (exit status 1): 0.00.014.583 E srv         start: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 44609"} {
		calls := 0
		err := RetryBind(func() error {
			if calls++; calls < 3 {
				return errors.New(msg)
			}
			return nil
		})
		if err != nil || calls != 3 {
			t.Fatalf("%q: %d calls, err %v; want 3 calls, nil", msg, calls, err)
		}
		calls = 0
		if err := RetryBind(func() error { calls++; return errors.New(msg) }); err == nil || calls != 3 {
			t.Fatalf("%q always: %d calls, err %v; want 3 calls and the error", msg, calls, err)
		}
	}
	calls := 0
	if err := RetryBind(func() error { calls++; return errors.New("exit status 1") }); err == nil || calls != 1 {
		t.Fatalf("other failure: %d calls, err %v; want 1 call and the error", calls, err)
	}
}
