package slowpath

import (
	"bytes"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// Validate checks cors: each origin is "*" or scheme://host[:port].
func (c *CORSConfig) Validate() error {
	for i, o := range c.AllowedOrigins {
		if o == "*" {
			continue
		}
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
			(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil || strings.HasSuffix(o, "/") {
			return fieldErrorf("cors.allowed_origins["+strconv.Itoa(i)+"]", "must be \"*\" or scheme://host[:port] (http or https, no path or trailing slash), got %q", o)
		}
	}
	if c.MaxAge < 0 || c.MaxAge > 24*time.Hour {
		return fieldErrorf("cors.max_age", "must be in [0s, 24h], got %s", c.MaxAge)
	}
	return nil
}

// corsPolicy answers preflights and decorates answers for allowed origins.
// Immutable after newCORS; safe for concurrent use.
type corsPolicy struct {
	any         bool
	origins     map[string]bool // lower-cased
	credentials bool
	maxAge      []byte
}

var (
	hdrOrigin         = []byte("Origin")
	hdrVary           = []byte("Vary")
	hdrACAO           = []byte("Access-Control-Allow-Origin")
	hdrACAC           = []byte("Access-Control-Allow-Credentials")
	hdrACAM           = []byte("Access-Control-Allow-Methods")
	hdrACAH           = []byte("Access-Control-Allow-Headers")
	hdrACEH           = []byte("Access-Control-Expose-Headers")
	hdrACMA           = []byte("Access-Control-Max-Age")
	hdrACRM           = []byte("Access-Control-Request-Method")
	hdrACRH           = []byte("Access-Control-Request-Headers")
	strAccessControl  = []byte("Access-Control-")
	strStar           = []byte("*")
	strTrue           = []byte("true")
	strOrigin         = []byte("Origin")
	strCORSMethods    = []byte("GET, POST, OPTIONS")
	strExposedHeaders = []byte("*")
	strOPTIONS        = []byte("OPTIONS")
)

// newCORS returns nil when no origin is allowed (CORS off).
func newCORS(c CORSConfig) *corsPolicy {
	if len(c.AllowedOrigins) == 0 {
		return nil
	}
	p := &corsPolicy{origins: map[string]bool{}, credentials: c.AllowCredentials,
		maxAge: strconv.AppendInt(nil, int64(c.MaxAge/time.Second), 10)}
	for _, o := range c.AllowedOrigins {
		if o == "*" {
			p.any = true
		}
		p.origins[strings.ToLower(o)] = true
	}
	return p
}

func (p *corsPolicy) allowed(origin []byte) bool {
	return len(origin) > 0 && (p.any || p.origins[strings.ToLower(string(origin))])
}

// preflight answers an OPTIONS preflight (Origin and
// Access-Control-Request-Method present) and reports whether it did. An
// origin not on the list gets a 403 in the OpenAI error shape.
func (p *corsPolicy) preflight(ctx *fasthttp.RequestCtx) bool {
	h := &ctx.Request.Header
	if !bytes.Equal(h.Method(), strOPTIONS) || len(h.PeekBytes(hdrACRM)) == 0 {
		return false
	}
	origin := h.PeekBytes(hdrOrigin)
	if !p.allowed(origin) {
		writeError(ctx, fasthttp.StatusForbidden, "Origin "+strconv.Quote(string(origin))+" is not allowed (cors.allowed_origins).", errTypeInvalid, "", "cors_origin_not_allowed")
		ctx.Response.Header.SetBytesKV(hdrVary, strOrigin)
		return true
	}
	ctx.Response.Reset()
	ctx.SetStatusCode(fasthttp.StatusNoContent)
	rh := &ctx.Response.Header
	p.setOrigin(rh, origin)
	rh.SetBytesKV(hdrACAM, strCORSMethods)
	if req := h.PeekBytes(hdrACRH); len(req) > 0 {
		rh.SetBytesKV(hdrACAH, req) // any request header may be sent (vLLM's default "*")
	}
	rh.SetBytesKV(hdrACMA, p.maxAge)
	return true
}

// decorate adds the CORS answer headers to a response for an allowed
// Origin, replacing any the engine sent (two Access-Control-Allow-Origin
// values make a browser refuse the answer).
func (p *corsPolicy) decorate(ctx *fasthttp.RequestCtx) {
	origin := ctx.Request.Header.PeekBytes(hdrOrigin)
	if len(origin) == 0 {
		return
	}
	rh := &ctx.Response.Header
	var drop [][]byte
	for k := range rh.All() {
		if len(k) > len(strAccessControl) && bytes.EqualFold(k[:len(strAccessControl)], strAccessControl) {
			drop = append(drop, append([]byte(nil), k...))
		}
	}
	for _, k := range drop {
		rh.DelBytes(k)
	}
	if !p.allowed(origin) {
		return
	}
	p.setOrigin(rh, origin)
	rh.SetBytesKV(hdrACEH, strExposedHeaders)
}

func (p *corsPolicy) setOrigin(rh *fasthttp.ResponseHeader, origin []byte) {
	if p.any && !p.credentials {
		rh.SetBytesKV(hdrACAO, strStar)
	} else {
		rh.SetBytesKV(hdrACAO, origin)
		rh.AddBytesKV(hdrVary, strOrigin)
	}
	if p.credentials {
		rh.SetBytesKV(hdrACAC, strTrue)
	}
}
