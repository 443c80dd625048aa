// About 650 lines, one job: relaying an SSE stream (reads, coalesced writes,
// stall and idle timeouts, client-gone checks); the scan of its events is sse.go.

package slowpath

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"

	"github.com/valyala/fasthttp"
)

// The stream relay. fasthttp frames what the exchange's WriteTo writes as
// one chunk per Write and flushes it (the exchange is a BodyWriterTo), so
// the relay decides what leaves in one client write:
//
//   - it reads the upstream body itself, off the connection's bufio.Reader,
//     with its own decoding of the engine's framing (Content-Length, chunked,
//     or until close), so it knows how much more is already buffered;
//   - it writes when the upstream has nothing more buffered: events that
//     arrived together (an engine writing several at once, or a burst the
//     socket queued while the client write ran) leave as one chunk, and an
//     event never waits for the next one;
//   - it cuts a full buffer at the last event boundary, so an event is not
//     split over two writes unless it alone is larger than the buffer;
//   - the server's write buffer (serverWriteBuffer) holds a full relay
//     buffer plus the chunk framing, so one chunk is one write syscall.
//
// The usage scan (scan) looks inside the events only until the first token
// and where a usage key appears; everything else it passes over with one
// search per read.

// relayBufSize bounds one client write of a stream. A few hundred SSE
// events of a usual size fit.
const relayBufSize = 16 << 10

// serverWriteBuffer is the server's per-connection write buffer: a relay
// buffer plus its chunk framing (hex size, two CRLFs), so a chunk is one
// write.
const serverWriteBuffer = relayBufSize + 32

// upstreamReadBuffer is the read buffer of an upstream connection: one
// read takes all a stream's socket holds (up to a relay buffer), so what
// arrived together is seen as buffered and leaves in one write.
const upstreamReadBuffer = relayBufSize

// maxChunkLine bounds a chunk-size or trailer line of the upstream body.
const maxChunkLine = 4 << 10

var strEventStream = []byte("text/event-stream")

var (
	errNotHere       = errors.New("relay: framing line not buffered yet") // internal to fill
	errBadChunk      = errors.New("upstream body: malformed chunk framing")
	errChunkTooLarge = errors.New("upstream body: chunk size out of range")
)

// framing is how the upstream delimits its body.
type framing uint8

const (
	framingLength  framing = iota // Content-Length bytes
	framingChunked                // chunked transfer encoding
	framingClose                  // until the upstream closes the connection
)

// chunkState is where a chunked body's decoding stands.
type chunkState uint8

const (
	chunkHeader  chunkState = iota // next: a chunk-size line
	chunkData                      // inside a chunk's data (relay.left bytes to go)
	chunkCRLF                      // a chunk's data ended; its CRLF next
	chunkTrailer                   // after the last chunk: trailer lines up to an empty one
)

// relay is a stream's upstream body decoder and client write buffer.
// Pooled with the exchange; reset by start.
type relay struct {
	buf     []byte
	framing framing
	state   chunkState
	left    int64 // bytes left: of the current chunk (chunked) or of the body (length)
	done    bool  // the body's end was read
	sse     bool  // the body is text/event-stream: written in whole events
	held    int   // bytes of buf not yet written: the start of an event cut at a full buffer
	total   int64 // bytes written to the client
}

func (rl *relay) start(contentLength int, contentType []byte) {
	rl.sse = bytes.HasPrefix(contentType, strEventStream)
	if cap(rl.buf) < relayBufSize {
		rl.buf = make([]byte, relayBufSize)
	}
	rl.buf = rl.buf[:relayBufSize]
	rl.state, rl.left, rl.done = chunkHeader, 0, false
	switch {
	case contentLength >= 0:
		rl.framing, rl.left = framingLength, int64(contentLength)
	case contentLength == -1:
		rl.framing = framingChunked
	default:
		rl.framing = framingClose
	}
}

// fill reads body bytes from br into p: it waits for the first byte, then
// takes only what br already holds (no further wait), so a caller writes
// as soon as the upstream has nothing more buffered. It returns io.EOF
// (possibly with n > 0) once the body has ended; any other error is the
// upstream failing (io.ErrUnexpectedEOF for a body cut short).
func (rl *relay) fill(br *bufio.Reader, p []byte) (n int, err error) {
	for n < len(p) && !rl.done {
		wait := n == 0
		if !wait && br.Buffered() == 0 {
			return n, nil
		}
		switch rl.framing {
		case framingLength:
			if rl.left == 0 {
				rl.done = true
				break
			}
			m, err := readSome(br, p[n:], rl.left, wait)
			n += m
			rl.left -= int64(m)
			if err == io.EOF {
				return n, io.ErrUnexpectedEOF // shorter than its Content-Length
			}
			if err != nil {
				return n, err
			}
			rl.done = rl.left == 0
		case framingClose:
			m, err := readSome(br, p[n:], int64(len(p)-n), wait)
			n += m
			if err == io.EOF {
				rl.done = true
				break
			}
			if err != nil {
				return n, err
			}
		default:
			if br.Buffered() > 0 {
				m, used, err := rl.chunkedBuffered(br, p[n:])
				n += m
				if err != nil {
					return n, err
				}
				if used {
					continue
				}
				if !wait {
					return n, nil // the rest of a framing line is still on its way
				}
			}
			m, err := rl.chunked(br, p[n:], wait)
			n += m
			if err == errNotHere {
				return n, nil // the rest of a framing line is still on its way
			}
			if err != nil {
				return n, err
			}
		}
	}
	if rl.done {
		return n, io.EOF
	}
	return n, nil
}

// readSome reads up to max(left, len(p)) bytes: with wait, at most one
// read of the connection; without, only what br holds.
func readSome(br *bufio.Reader, p []byte, left int64, wait bool) (int, error) {
	k := int(min(left, int64(len(p))))
	if !wait {
		k = min(k, br.Buffered())
	}
	if k == 0 {
		return 0, nil
	}
	return br.Read(p[:k])
}

// chunked advances a chunked body by one step: a framing line or CRLF, or
// some data into p. Without wait it does nothing that would block: a
// framing line is taken only when br holds all of it, else errNotHere.
func (rl *relay) chunked(br *bufio.Reader, p []byte, wait bool) (int, error) {
	switch rl.state {
	case chunkData:
		m, err := readSome(br, p, rl.left, wait)
		rl.left -= int64(m)
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if rl.left == 0 {
			rl.state = chunkCRLF
		}
		return m, err
	case chunkCRLF:
		if !wait && br.Buffered() < 2 {
			return 0, errNotHere
		}
		b, err := br.Peek(2)
		if err != nil {
			return 0, eofUnexpected(err)
		}
		if b[0] != '\r' || b[1] != '\n' {
			return 0, errBadChunk
		}
		_, _ = br.Discard(2)
		rl.state = chunkHeader
		return 0, nil
	}
	// The whole line is buffered before ReadSlice, which would consume a
	// partial line on a read error.
	for {
		b, _ := br.Peek(br.Buffered())
		if bytes.IndexByte(b, '\n') >= 0 {
			break
		}
		if len(b) >= maxChunkLine {
			return 0, errBadChunk
		}
		if !wait {
			return 0, errNotHere
		}
		if _, err := br.Peek(len(b) + 1); err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return 0, eofUnexpected(err)
		}
	}
	line, err := br.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return 0, errBadChunk
		}
		return 0, eofUnexpected(err)
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return 0, errBadChunk
	}
	line = line[:len(line)-2]
	if rl.state == chunkTrailer {
		if len(line) == 0 {
			rl.done = true
		}
		return 0, nil // trailer fields are not relayed (fasthttp writes none)
	}
	size, err := parseChunkSize(line)
	if err != nil {
		return 0, err
	}
	if size == 0 {
		rl.state = chunkTrailer
		return 0, nil
	}
	rl.state, rl.left = chunkData, size
	return 0, nil
}

// chunkedBuffered decodes what br holds of a chunked body into p in one
// pass over br's buffer, without a read: data up to p's room, framing
// lines and CRLFs it holds whole (64 events in one upstream write are 64
// chunks; stepping through them with chunked costs a few bufio calls
// each). used reports whether it consumed any byte; false: br holds only
// the start of a framing line, or p has no room.
func (rl *relay) chunkedBuffered(br *bufio.Reader, p []byte) (n int, used bool, err error) {
	b, _ := br.Peek(br.Buffered())
	i := 0
loop:
	for n < len(p) && !rl.done && i < len(b) {
		switch rl.state {
		case chunkData:
			k := int(min(rl.left, int64(len(b)-i), int64(len(p)-n)))
			copy(p[n:], b[i:i+k])
			n += k
			i += k
			if rl.left -= int64(k); rl.left == 0 {
				rl.state = chunkCRLF
			}
		case chunkCRLF:
			if len(b)-i < 2 {
				break loop
			}
			if b[i] != '\r' || b[i+1] != '\n' {
				err = errBadChunk
				break loop
			}
			i += 2
			rl.state = chunkHeader
		default: // a chunk-size or trailer line
			j := bytes.IndexByte(b[i:], '\n')
			if j < 0 {
				if len(b)-i >= maxChunkLine {
					err = errBadChunk
				}
				break loop
			}
			line := b[i : i+j+1]
			if len(line) < 2 || line[len(line)-2] != '\r' {
				err = errBadChunk
				break loop
			}
			i += j + 1
			line = line[:len(line)-2]
			if rl.state == chunkTrailer {
				rl.done = len(line) == 0 // trailer fields are not relayed
				continue
			}
			size, perr := parseChunkSize(line)
			if perr != nil {
				err = perr
				break loop
			}
			if size == 0 {
				rl.state = chunkTrailer
			} else {
				rl.state, rl.left = chunkData, size
			}
		}
	}
	_, _ = br.Discard(i)
	return n, i > 0, err
}

// parseChunkSize parses a chunk-size line without its CRLF: hex digits,
// then optional whitespace and chunk extensions (";name=value"), ignored.
func parseChunkSize(line []byte) (int64, error) {
	var size int64
	i := 0
	for ; i < len(line); i++ {
		c := line[i]
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			goto rest
		}
		if size > (1<<40)>>4 {
			return 0, errChunkTooLarge
		}
		size = size<<4 | int64(d)
	}
rest:
	if i == 0 {
		return 0, errBadChunk
	}
	for ; i < len(line); i++ {
		switch line[i] {
		case ' ', '\t':
		case ';':
			return size, nil
		default:
			return 0, errBadChunk
		}
	}
	return size, nil
}

func eofUnexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// startStream hands the upstream body to fasthttp with the exchange as the
// body stream (WriteTo: see the top of this file); no goroutine.
func (s *Server) startStream(ctx *fasthttp.RequestCtx, ex *exchange, uresp *fasthttp.Response, bs io.Reader) {
	// upstream.idle_timeout starts at the first token, not at the headers
	// (the engine queues and prefills after sending them).
	if ex.idle = idleOf(uresp.LocalAddr()); ex.idle != nil {
		if err := ex.idle.hold(); err != nil {
			ex.idle = nil
		}
	}
	copyResponseHeader(&ctx.Response.Header, &uresp.Header)
	ctx.Response.Header.DelBytes(hdrContentLength)
	ex.uresp = uresp
	ex.stream = bs
	ex.rl.start(uresp.Header.ContentLength(), uresp.Header.ContentType())
	if !ctx.Request.Header.IsHTTP11() {
		// An HTTP/1.0 client cannot read chunked encoding, which is all
		// fasthttp writes for a body of unknown length: the stream is
		// relayed on the hijacked connection, delimited by its close.
		ex.h10 = appendHTTP10Header(ex.h10[:0], &ctx.Response.Header)
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(ex.relayHTTP10)
		return
	}
	ctx.Response.SetBodyStream(ex, -1)
}

// appendHTTP10Header appends an HTTP/1.0 status line and h's fields,
// without framing or connection fields, and Connection: close.
func appendHTTP10Header(b []byte, h *fasthttp.ResponseHeader) []byte {
	b = append(b, "HTTP/1.0 "...)
	b = strconv.AppendInt(b, int64(h.StatusCode()), 10)
	b = append(b, ' ')
	b = append(b, fasthttp.StatusMessage(h.StatusCode())...)
	b = append(b, "\r\n"...)
	for k, v := range h.All() {
		if bytes.EqualFold(k, hdrContentLength) || bytes.EqualFold(k, hdrTransferEnc) || bytes.EqualFold(k, hdrConnection) {
			continue
		}
		b = append(append(append(append(b, k...), ": "...), v...), "\r\n"...)
	}
	return append(b, "Connection: close\r\n\r\n"...)
}

// relayHTTP10 writes an HTTP/1.0 client's stream on its hijacked
// connection (fasthttp closes it after): the header, then the relay, then
// the exchange ends as a streamed one does.
func (ex *exchange) relayHTTP10(c net.Conn) {
	s, raw := ex.s, c
	if u, ok := c.(interface{ UnsafeConn() net.Conn }); ok {
		raw = u.UnsafeConn() // fasthttp's wrapper does not close on Close
	}
	// Shutdown closes it past the drain deadline. Its own key: fasthttp
	// reports the connection hijacked (connState deletes raw) after this
	// goroutine may have started.
	key := &hijackedConn{raw}
	s.connMu.Lock()
	s.conns[key] = struct{}{}
	s.connMu.Unlock()
	defer func() {
		s.connMu.Lock()
		delete(s.conns, key)
		s.connMu.Unlock()
	}()
	_, werr := c.Write(ex.h10)
	if werr == nil {
		_, werr = ex.WriteTo(c)
	}
	_ = ex.CloseWithError(werr)
}

// hijackedConn is a hijacked connection's entry in Server.conns.
type hijackedConn struct{ net.Conn }

// SupportsBodyWriteTo lets fasthttp consume the stream through WriteTo.
func (ex *exchange) SupportsBodyWriteTo() bool { return true }

// WriteTo relays the upstream body to w, one Write per batch of events
// that arrived together. An upstream failure after the first byte ends the
// stream with an OpenAI-style SSE error event (and no [DONE]), as vLLM does
// when generation fails mid-stream; the error is kept for CloseWithError.
// It returns an error only when w fails (the client went away).
func (ex *exchange) WriteTo(w io.Writer) (int64, error) {
	ex.rl.held, ex.rl.total = 0, 0
	for {
		if more, werr := ex.relayStep(w); !more || werr != nil {
			return ex.rl.total, werr
		}
	}
}

// relayStep relays what fill gives once: whole events when more is to
// come (the start of the next is held), everything at the body's end.
// more is false once the stream is over (read to its end, or the upstream
// failed and the error event was written). werr: w failed.
func (ex *exchange) relayStep(w io.Writer) (more bool, werr error) {
	rl := &ex.rl
	buf := rl.buf
	n, err := rl.fill(ex.up.br, buf[rl.held:])
	if n > 0 {
		ex.observe(buf[rl.held : rl.held+n])
	}
	rl.held += n
	cut := rl.held
	if err == nil && rl.sse {
		// More to come: write whole events and keep the start of the
		// next (a client cannot use it before its end arrives), unless
		// one event alone fills the buffer.
		if e := lastEventEnd(buf[:rl.held]); e > 0 {
			cut = e
		} else if rl.held < len(buf) {
			cut = 0
		}
	}
	if cut > 0 {
		if _, werr := w.Write(buf[:cut]); werr != nil {
			return false, werr
		}
		rl.total += int64(cut)
		rl.held = copy(buf, buf[cut:rl.held])
	}
	switch {
	case err == io.EOF:
		ex.streamEOF = true
		return false, nil
	case err != nil:
		return false, ex.upstreamBroke(w, err)
	}
	return true, nil
}

// upstreamBroke keeps the upstream's error and writes the error event.
func (ex *exchange) upstreamBroke(w io.Writer, err error) error {
	ex.upErr = err
	if _, werr := w.Write(sseBroken); werr != nil {
		return werr
	}
	ex.errSent = len(sseBroken)
	ex.rl.total += int64(len(sseBroken))
	return nil
}

// lastEventEnd returns the index just past the last blank line of b (an
// SSE event's end: LF LF or LF CR LF), or -1.
func lastEventEnd(b []byte) int {
	for i := len(b); ; i-- {
		i = bytes.LastIndexByte(b[:i], '\n')
		if i < 1 {
			return -1
		}
		if b[i-1] == '\n' || b[i-1] == '\r' && i >= 2 && b[i-2] == '\n' {
			return i + 1
		}
	}
}

// Read implements io.Reader (the body stream's type); fasthttp uses
// WriteTo. Each Read returns what fill gives, then the error event.
func (ex *exchange) Read(p []byte) (int, error) {
	if ex.upErr != nil {
		n := copy(p, sseBroken[ex.errSent:])
		ex.errSent += n
		if ex.errSent < len(sseBroken) {
			return n, nil
		}
		return n, io.EOF
	}
	if ex.streamEOF {
		return 0, io.EOF
	}
	n, err := ex.rl.fill(ex.up.br, p)
	if n > 0 {
		ex.observe(p[:n])
	}
	switch {
	case err == io.EOF:
		ex.streamEOF = true
	case err != nil:
		ex.upErr = err
		return n, nil // the error event follows on the next Read
	}
	return n, err
}

// observe looks at relayed bytes before they are written: the usage scan,
// the first token (the first SSE event with output; any byte of a non-200
// answer), which starts upstream.idle_timeout, and, for a stream's reads
// from its first token on, the replica's step clock (Router.Token: each
// read is an engine step's events).
func (ex *exchange) observe(b []byte) {
	if ex.status != fasthttp.StatusOK {
		ex.output = true
		if !ex.gotFirst {
			ex.firstToken(ex.s.now())
			ex.releaseIdle()
		}
		return
	}
	ex.scan(b)
	if !ex.output || ex.gotFirst && !ex.rl.sse {
		return
	}
	now := ex.s.now()
	if !ex.gotFirst {
		ex.firstToken(now)
		ex.releaseIdle()
	}
	if ex.rl.sse {
		ex.s.brain.Token(&ex.flight, now)
	}
}

// releaseIdle starts upstream.idle_timeout (the first token came).
func (ex *exchange) releaseIdle() {
	if ex.idle != nil {
		ex.idle.release()
	}
}

// sseBroken ends a stream whose upstream failed mid-way. The leading blank
// line terminates an event the upstream left half-written.
var sseBroken = []byte("\n\ndata: {\"error\":{\"message\":\"The upstream replica failed mid-stream.\",\"type\":\"upstream_error\",\"param\":null,\"code\":\"upstream_error\"}}\n\n")

// CloseWithError is called by fasthttp once the body is written (werr is
// the client-side write error, if any). It finishes the exchange.
func (ex *exchange) CloseWithError(werr error) error {
	if ex.closed {
		return nil
	}
	ex.closed = true
	s := ex.s
	// A body read to its end leaves the connection at the next response,
	// unless the body was delimited by the upstream closing it.
	reuse := ex.streamEOF && ex.upErr == nil && !ex.uresp.ConnectionClose() && ex.rl.framing != framingClose
	ex.uresp.CloseBodyStream() //nolint:errcheck // nothing to do about it
	ex.up.release(reuse)       // not read to its end: closed, the engine cancels
	fasthttp.ReleaseResponse(ex.uresp)
	ex.uresp = nil
	if ex.line != nil && !ex.lineDrop && len(ex.line) > 0 {
		ex.sseLine(ex.line)
		if ex.output && !ex.gotFirst {
			ex.firstToken(ex.s.now())
		}
	}
	ok := ex.upErr == nil
	if !ok {
		ex.rep.m.broken.Inc()
		ex.rep.log.Warn("stream broken after bytes reached the client", "err", ex.upErr,
			"upstream_idle", errors.Is(ex.upErr, errUpstreamIdle))
		s.proxyFailed(ex.rep, ex.upErr)
	} else if !s.retryStatus(ex.status) {
		ex.rep.proxyOK()
	}
	if ok && werr != nil {
		ex.rep.log.Debug("client went away mid-stream", "err", werr)
	}
	s.completeAt(ex, ok, werr, s.now())
	return nil
}
