package slowpath

import (
	"bytes"

	"io"
	"mime"
	"mime/multipart"
	"net"
	"net/netip"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
	"github.com/warmpath/warmpath/affinity"
)

// Pass-through endpoints: the router reads only the model (a JSON field, or
// a multipart form field for audio), picks a replica serving it (by load:
// there is no prompt prefix to reuse) and forwards the request byte for
// byte, answers (and streams) back unchanged, with the same retries, limits
// and metrics as chat. A request without a model goes to the fleet's only
// model, or is a 400 when the fleet serves several.

// passJSONPaths are the vLLM endpoints forwarded as JSON; tokenizing costs
// the engine no GPU work, so those count no prompt tokens.
var passJSONPaths = map[string]bool{
	"/tokenize": false, "/detokenize": false,
	"/v1/rerank": true, "/rerank": true, "/v2/rerank": true,
	"/v1/score": true, "/score": true, "/pooling": true, "/classify": true,
}

func isPassJSON(path string) bool {
	_, ok := passJSONPaths[path]
	return ok
}

var (
	strPlusJSON  = []byte("+json")
	strAppSlash  = []byte("application/")
	strMultipart = []byte("multipart/form-data")
)

// isPlusJSON reports a structured-syntax JSON media type,
// application/<subtype>+json (RFC 6839), e.g. application/vnd.api+json.
func isPlusJSON(ct []byte) bool {
	return len(ct) > len(strAppSlash)+len(strPlusJSON) &&
		bytes.EqualFold(ct[:len(strAppSlash)], strAppSlash) &&
		bytes.EqualFold(ct[len(ct)-len(strPlusJSON):], strPlusJSON)
}

func isMultipart(ct []byte) bool {
	return len(ct) >= len(strMultipart) && bytes.EqualFold(ct[:len(strMultipart)], strMultipart)
}

var (
	errPassNotObject = &affinity.FieldError{Msg: "body is not a JSON object"}
	errPassModel     = &affinity.FieldError{Field: "model", Msg: "model must be a non-empty string"}
	errPassDupModel  = &affinity.FieldError{Field: "model", Msg: "model must appear once, spelled in lower case (the body repeats it or has it in another letter case)"}
)

// parsePassJSON reads the model of a pass-through JSON body.
func (s *Server) parsePassJSON(ctx *fasthttp.RequestCtx, ex *exchange, body []byte) error {
	ex.prompt = affinity.Prompt{}
	v, err := ex.fjParser.ParseBytes(body)
	if err != nil || v.Type() != fastjson.TypeObject {
		return errPassNotObject
	}
	o, _ := v.Object()
	n := 0
	o.Visit(func(k []byte, _ *fastjson.Value) {
		if bytes.EqualFold(k, strModel) {
			n++
			if string(k) != "model" {
				n++
			}
		}
	})
	if n > 1 {
		return errPassDupModel
	}
	m := o.Get("model")
	switch {
	case m == nil || m.Type() == fastjson.TypeNull:
		ex.prompt.Model = s.soleModel()
	case m.Type() == fastjson.TypeString:
		ex.prompt.Model, _ = m.StringBytes()
		if len(ex.prompt.Model) == 0 {
			return errPassModel
		}
	default:
		return errPassModel
	}
	if passJSONPaths[string(ctx.Path())] {
		ex.prompt.Tokens = len(body) / s.bytesPerToken()
	} else {
		ex.api.noWork = true
	}
	return nil
}

var strModel = []byte("model")

func (s *Server) bytesPerToken() int {
	if b := s.cfg.Routing.Hash.BytesPerToken; b > 0 {
		return b
	}
	return 4
}

// soleModel is the model name when the healthy fleet serves exactly one;
// nil otherwise. Error path and model-less requests only.
func (s *Server) soleModel() []byte {
	var one string
	for _, r := range *s.table.Load() {
		if r == nil || r.removed.Load() {
			continue
		}
		for _, m := range r.cfg.Load().Models {
			if one != "" && m != one {
				return nil
			}
			one = m
		}
	}
	if one == "" {
		return nil
	}
	return []byte(one)
}

// Multipart bounds: the router reads part headers and the small fields it
// routes on; file parts are skipped over in the (already bounded) body.
const (
	maxMultipartParts = 256
	maxFormField      = 1 << 10
)

var (
	errBadMultipart = &affinity.FieldError{Msg: "body is not a valid multipart/form-data body"}
	errMultiModel   = &affinity.FieldError{Field: "model", Msg: "model must be one non-empty form field of at most 1024 bytes"}
	errMultiStream  = &affinity.FieldError{Field: "stream", Msg: "stream must be true or false"}
)

// parseMultipart reads the `model` and `stream` form fields of an audio
// request (multipart/form-data, vLLM's /v1/audio/transcriptions and
// /translations). The body is limits.max_body_bytes at most: fasthttp
// refuses a larger one before the handler runs.
func (s *Server) parseMultipart(ctx *fasthttp.RequestCtx, ex *exchange, body []byte) error {
	ex.prompt = affinity.Prompt{}
	_, params, err := mime.ParseMediaType(string(ctx.Request.Header.ContentType()))
	if err != nil || params["boundary"] == "" {
		return errBadMultipart
	}
	mr := multipart.NewReader(bytes.NewReader(body), params["boundary"])
	var models int
	for i := 0; ; i++ {
		if i >= maxMultipartParts {
			return errBadMultipart
		}
		p, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return errBadMultipart
		}
		switch p.FormName() {
		case "model":
			models++
			ex.api.tmp, err = readField(ex.api.tmp[:0], p)
			if err != nil || len(ex.api.tmp) == 0 || models > 1 {
				return errMultiModel
			}
		case "stream":
			v, err := readField(nil, p)
			switch {
			case err != nil:
				return errMultiStream
			case bytes.EqualFold(v, strTrue):
				ex.prompt.Stream = true
			case bytes.EqualFold(v, []byte("false")):
				ex.prompt.Stream = false
			default:
				return errMultiStream
			}
		}
	}
	if models == 0 {
		ex.prompt.Model = s.soleModel()
	} else {
		ex.prompt.Model = ex.api.tmp
	}
	return nil
}

// readField appends a small form field's value; an error past maxFormField.
func readField(dst []byte, p *multipart.Part) ([]byte, error) {
	var buf [256]byte
	for {
		n, err := p.Read(buf[:])
		dst = append(dst, buf[:n]...)
		if len(dst) > maxFormField {
			return dst, errMultiModel
		}
		if err == io.EOF {
			return bytes.TrimSpace(dst), nil
		}
		if err != nil {
			return dst, err
		}
	}
}

// version answers GET /version from any healthy replica (vLLM's
// {"version": ...}).
func (s *Server) version(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() {
		s.reject(ctx, apiMethod, "Method "+string(ctx.Method())+" not allowed for /version; use GET", "")
		ctx.Response.Header.SetBytesKV(hdrAllow, strGET)
		return
	}
	for _, r := range *s.table.Load() {
		if r != nil && !r.removed.Load() && r.isHealthy() && !r.full() {
			s.routeTo(ctx, r, false)
			return
		}
	}
	s.reject(ctx, apiNoReplica, "No healthy replica can answer right now.", "")
}

// routeTo proxies the request to r (no model decision), with the same
// admission, upstream handling and metrics as routed requests.
func (s *Server) routeTo(ctx *fasthttp.RequestCtx, r *replica, stream bool) {
	ex := s.getExchange()
	ex.start = s.now()
	ex.ep = epFixed
	ex.prompt = affinity.Prompt{Stream: stream}
	ex.model = ex.model[:0]
	ex.api.fixed = r
	ex.api.noWork = true
	if !s.admit(ex) {
		s.putExchange(ex)
		s.reject(ctx, apiTotalLimit, "The router is at its concurrency limit; retry later.", "")
		return
	}
	ex.req.Model = ex.model
	ex.req.Hashes = nil
	ex.req.PromptTokens = 0
	ex.req.SessionKey = 0
	ex.client = clientAddr(ctx)
	s.forward(ctx, ex, ctx.PostBody())
}

func clientAddr(ctx *fasthttp.RequestCtx) netip.AddrPort {
	if ta, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}
