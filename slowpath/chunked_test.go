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

// TestSentHeaders: buildUpstream's scan of the client's raw header block
// finds each header it must drop, in any case and with spaces around the
// name, and nothing else; no raw block, or a chunked body (trailer fields
// are not in the block), means drop everything.
func TestSentHeaders(t *testing.T) {
	bit := func(h []byte) uint16 {
		for i, d := range dropHeaders {
			if bytes.Equal(d, h) {
				return 1 << i
			}
		}
		t.Fatalf("%s is not a drop header", h)
		return 0
	}
	cases := []struct {
		name, raw string
		want      uint16
	}{
		{"none", "Host: a\r\nContent-Type: application/json\r\nX-Keep-Alive-Ish: 1\r\n\r\n", 0},
		{"empty", "", dropAll},
		{"hop-by-hop", "Host: a\r\nkeep-alive: 5\r\nTE: trailers\r\nUPGRADE: h2c\r\nProxy-Connection: keep-alive\r\nConnection: close, X-Secret\r\n\r\n",
			bit(hdrKeepAlive) | bit(hdrTE) | bit(hdrUpgrade) | bit(hdrProxyConnection) | bit(hdrConnection)},
		{"forwarding", "x-forwarded-for: 1.2.3.4\r\nX-Real-IP : 5.6.7.8\r\nForwarded: for=x\r\nAccept-Encoding: gzip\r\nExpect: 100-continue\r\n\r\n",
			bit(hdrXForwardedFor) | bit(hdrXRealIP) | bit(hdrForwarded) | bit(hdrAcceptEncoding) | bit(hdrExpect)},
		{"chunked", "Host: a\r\nTransfer-Encoding: chunked\r\n\r\n", dropAll},
		{"trailer", "Host: a\r\nTrailer: X-Forwarded-For\r\n\r\n", dropAll},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := sentHeaders([]byte(c.raw)); got != c.want {
				t.Fatalf("sentHeaders = %012b, want %012b", got, c.want)
			}
		})
	}
}
