package slowpath

import (
	"bufio"
	"bytes"
	"io"
	"net/http/httputil"
	"testing"
)

// splitReader returns its data in reads of the sizes cuts gives in turn
// (cycling), so a framing line or a CRLF can end at any read.
type splitReader struct {
	b    []byte
	cuts []byte
	i    int
}

func (r *splitReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := len(r.b)
	if len(r.cuts) > 0 {
		n = int(r.cuts[r.i%len(r.cuts)])%64 + 1
		r.i++
	}
	n = copy(p, r.b[:min(n, len(r.b))])
	r.b = r.b[n:]
	return n, nil
}

// FuzzChunkedDecode decodes arbitrary bytes as a chunked body with the
// relay's decoder (relay.fill: the buffered fast path and the step-by-step
// one) and with net/http's: the same data where both accept it, an error
// where net/http finds the framing broken, however reads split it and
// whatever the relay buffer's size.
func FuzzChunkedDecode(f *testing.F) {
	f.Add([]byte("5\r\nhello\r\n0\r\n\r\n"), []byte{0}, uint16(16))
	f.Add([]byte("3;ext=1 \r\nabc\r\n2\r\nde\r\n0\r\nX-T: 1\r\n\r\n"), []byte{1, 2, 3}, uint16(2))
	f.Add([]byte("A\r\n0123456789\r\n0\r\n\r\n"), []byte{5}, uint16(3))
	f.Add([]byte("3\r\nabcXY0\r\n\r\n"), []byte{}, uint16(64))
	f.Add([]byte("zz\r\nabc\r\n0\r\n\r\n"), []byte{7}, uint16(8))
	f.Fuzz(func(t *testing.T, body, cuts []byte, room uint16) {
		want, werr := io.ReadAll(httputil.NewChunkedReader(bytes.NewReader(body)))
		br := bufio.NewReaderSize(&splitReader{b: body, cuts: cuts}, 64)
		var rl relay
		rl.start(-1, strEventStream)
		p := make([]byte, int(room)%64+1)
		var got []byte
		var err error
		for range 1 << 16 {
			var n int
			n, err = rl.fill(br, p)
			got = append(got, p[:n]...)
			if err != nil {
				break
			}
		}
		if err == io.EOF {
			err = nil
		}
		switch {
		case werr == nil && err == nil:
			if !bytes.Equal(got, want) {
				t.Fatalf("relay decoded %q, net/http %q", got, want)
			}
		case werr == nil && err != nil:
			// net/http stops at the last chunk; the relay also reads the
			// trailer to its blank line, so only a body cut inside it may fail.
			if !bytes.Equal(got, want) {
				t.Fatalf("relay failed (%v) after %q; net/http decoded %q", err, got, want)
			}
		case werr != nil && err == nil:
			if !bytes.HasPrefix(want, got) && !bytes.HasPrefix(got, want) {
				t.Fatalf("relay decoded %q where net/http fails (%v) after %q", got, werr, want)
			}
		}
	})
}
