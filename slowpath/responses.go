package slowpath

import (
	"bytes"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// The Responses API (/v1/responses) is routed like chat (model-aware,
// prefix-aware from `instructions` and `input`). A response is engine
// state: vLLM keeps it in its own process, so a request naming
// `previous_response_id` can only be served by the replica that produced
// that response. The router remembers response id -> replica from each
// answer's `id` (non-streamed body, or the stream's `response.created`
// event) in a bounded LRU with a TTL, and pins such requests to that
// replica:
//
//	replica present, healthy, not full  -> that replica only (no retry elsewhere)
//	replica removed from the pool       -> 404 previous_response_not_found
//	replica unhealthy or ejected        -> 503 replica_unavailable (Retry-After: 1)
//	replica at its concurrency cap      -> 429 rate_limit_exceeded
//	replica does not serve the model    -> 400, param previous_response_id
//	id unknown to the router            -> the replicas serving the model are
//	                                       asked (GET /v1/responses/{id}); the
//	                                       one that has it is remembered and
//	                                       pinned; if none has it, routed like
//	                                       any request (the engine's 404)
//
// GET /v1/responses/{id} and POST /v1/responses/{id}/cancel go to the
// replica holding id (looked up on the engines when the router does not
// know it); an id no engine holds is a 404 (param response_id, vLLM's
// wording).

// Response-store bounds: entries beyond responseStoreMax evict the least
// recently used; an entry older than responseStoreTTL is gone.
const (
	responseStoreMax = 1 << 16
	responseStoreTTL = time.Hour
)

// saltable reports whether tenancy may add cache_salt to the body: JSON
// generation requests (chat, completions, embeddings, responses), not the
// pass-through ones (a multipart body, or endpoints without a prompt cache).
func (e endpoint) saltable() bool { return e <= epResponses }

// apiServer is the per-Server state of the endpoints beyond chat.
type apiServer struct {
	responses *responseStore
	models    modelsCache // models.go
}

func newAPIServer() *apiServer {
	return &apiServer{responses: newResponseStore(responseStoreMax, int64(responseStoreTTL))}
}

// apiState is one exchange's Responses / pass-through state. Reset per
// request; its buffers are kept.
type apiState struct {
	prevID []byte   // previous_response_id of the request (copy)
	fixed  *replica // epFixed: the target chosen before forward
	seenID bool     // the stream's response id was stored
	// noWork: the engine generates nothing for this request (tokenize,
	// /version, a stored response): its timing must not feed the
	// replica's prefill and batch-slot models.
	noWork bool
	tmp    []byte // scratch (multipart model field)
}

func (a *apiState) reset() {
	a.prevID = a.prevID[:0]
	a.fixed = nil
	a.seenID = false
	a.noWork = false
}

// responseStore maps response ids to the replica (name) that holds them:
// an LRU bounded to max entries, each valid for ttl after it was stored.
// Safe for concurrent use. Times are the caller's clock (s.now()).
type responseStore struct {
	mu         sync.Mutex
	max        int
	ttl        int64
	m          map[string]*respEntry
	head, tail *respEntry // head = most recently used
}

type respEntry struct {
	id, replica string
	at          int64
	prev, next  *respEntry
}

func newResponseStore(max int, ttl int64) *responseStore {
	return &responseStore{max: max, ttl: ttl, m: make(map[string]*respEntry)}
}

func (st *responseStore) unlink(e *respEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		st.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		st.tail = e.prev
	}
	e.prev, e.next = nil, nil
}

func (st *responseStore) pushFront(e *respEntry) {
	e.next = st.head
	if st.head != nil {
		st.head.prev = e
	}
	st.head = e
	if st.tail == nil {
		st.tail = e
	}
}

// put records that replica holds response id, as of now.
func (st *responseStore) put(id []byte, replica string, now int64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if e := st.m[string(id)]; e != nil {
		e.replica, e.at = replica, now
		st.unlink(e)
		st.pushFront(e)
		return
	}
	var e *respEntry
	if len(st.m) >= st.max && st.tail != nil {
		e = st.tail // reuse the evicted entry
		st.unlink(e)
		delete(st.m, e.id)
	} else {
		e = &respEntry{}
	}
	e.id, e.replica, e.at = string(id), replica, now
	st.m[e.id] = e
	st.pushFront(e)
}

// get returns the replica holding id; false when unknown or expired.
func (st *responseStore) get(id []byte, now int64) (string, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	e := st.m[string(id)]
	if e == nil {
		return "", false
	}
	if now-e.at > st.ttl {
		st.unlink(e)
		delete(st.m, e.id)
		return "", false
	}
	st.unlink(e)
	st.pushFront(e)
	return e.replica, true
}

func (st *responseStore) len() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.m)
}

// Looking an unknown id up on the engines: only ids shaped like vLLM's
// (prefix "resp", at most maxResponseIDLen bytes), so a client sending
// junk ids cannot make every request fan out.
const maxResponseIDLen = 128

var strRespPrefix = []byte("resp")

// findResponse asks every healthy replica serving model (any replica when
// model is nil) whether it holds response id (GET /v1/responses/{id}, with the
// client's Authorization: vLLM checks its API key there too), in parallel
// over the control connections health checks use, each bounded by
// health.timeout. A hit is stored. This runs only for ids
// the router does not know: after a restart, an eviction, or when another
// router instance of a fleet served the previous turn.
func (s *Server) findResponse(ctx *fasthttp.RequestCtx, id, model []byte) (string, bool) {
	if len(id) > maxResponseIDLen || !bytes.HasPrefix(id, strRespPrefix) {
		return "", false
	}
	var cands []*replica
	for _, r := range *s.table.Load() {
		if r != nil && !r.removed.Load() && r.isHealthy() && (model == nil || r.serves(model)) {
			cands = append(cands, r)
		}
	}
	if len(cands) == 0 {
		return "", false
	}
	uri := "/v1/responses/" + url.PathEscape(string(id))
	auth := string(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization))
	found := make([]bool, len(cands))
	var wg sync.WaitGroup
	for i, r := range cands {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.SetRequestURI("http://" + r.name + uri)
			req.Header.SetHost(r.name)
			if auth != "" {
				req.Header.Set(fasthttp.HeaderAuthorization, auth)
			}
			err := r.ctl.DoTimeout(req, resp, s.cfg.Health.Timeout)
			found[i] = err == nil && resp.StatusCode() == fasthttp.StatusOK
		}()
	}
	wg.Wait()
	for i, ok := range found {
		if ok {
			s.api.responses.put(id, cands[i].name, s.now())
			return cands[i].name, true
		}
	}
	return "", false
}

// replicaByName returns the replica of that name in the serving table.
func (s *Server) replicaByName(name string) *replica {
	for _, r := range *s.table.Load() {
		if r != nil && !r.removed.Load() && r.name == name {
			return r
		}
	}
	return nil
}

// rank fills ex.dec: the fixed target of an epFixed request, the replica
// holding previous_response_id, or the affinity decision. false means the
// client has its answer (an error).
func (s *Server) rank(ctx *fasthttp.RequestCtx, ex *exchange) bool {
	if ex.ep >= epPassJSON {
		ex.req.Buffered = !ex.prompt.Stream
	}
	if r := ex.api.fixed; r != nil {
		ex.dec.Ranked = append(ex.dec.Ranked[:0], r.id)
		ex.dec.CachedTokens = append(ex.dec.CachedTokens[:0], 0)
		return true
	}
	var pin *replica
	if len(ex.api.prevID) > 0 {
		name, ok := s.api.responses.get(ex.api.prevID, s.now())
		if !ok {
			name, ok = s.findResponse(ctx, ex.api.prevID, ex.model)
		}
		if ok {
			if pin = s.pinnable(ctx, ex, name); pin == nil {
				return false
			}
		}
	}
	// A pinned request goes to its pin whatever the ranking: it does not
	// wait for another replica's slot.
	ex.req.NoHold, ex.req.HoldSince, ex.req.HeldFor = pin != nil, 0, 0
	if !s.decide(ctx, ex) {
		return false
	}
	if pin != nil {
		pred := 0
		for i, id := range ex.dec.Ranked {
			if id == pin.id && i < len(ex.dec.CachedTokens) {
				pred = ex.dec.CachedTokens[i]
			}
		}
		ex.dec.Ranked = append(ex.dec.Ranked[:0], pin.id)
		ex.dec.CachedTokens = append(ex.dec.CachedTokens[:0], pred)
	}
	return true
}

// pinnable checks the replica holding the previous response; nil after
// answering the client with why it cannot be used.
func (s *Server) pinnable(ctx *fasthttp.RequestCtx, ex *exchange, name string) *replica {
	id := string(ex.api.prevID)
	r := s.replicaByName(name)
	switch {
	case r == nil:
		s.reject(ctx, apiPrevGone,
			"Previous response with id '"+id+"' was held by replica "+name+", which is no longer in the pool; start a new conversation.", "previous_response_id")
	case !r.serves(ex.model):
		s.reject(ctx, apiPrevModel,
			"Previous response with id '"+id+"' is held by a replica that does not serve model `"+string(ex.model)+"`.", "previous_response_id")
	case !r.isHealthy():
		s.reject(ctx, apiPrevUnavailable,
			"The replica holding previous response '"+id+"' is unavailable right now; retry later.", "previous_response_id")
	case r.full():
		s.reject(ctx, apiReplicaLimit,
			"The replica holding previous response '"+id+"' is at its concurrency limit; retry later.", "")
	default:
		return r
	}
	return nil
}

// responseAnswered stores the id of a non-streamed Responses answer and
// reads its cached tokens (usage.input_tokens_details.cached_tokens).
func (s *Server) responseAnswered(ex *exchange, body []byte) {
	v, err := ex.fjParser.ParseBytes(body)
	if err != nil {
		return
	}
	if id := v.GetStringBytes("id"); len(id) > 0 {
		s.api.responses.put(id, ex.rep.name, s.now())
	}
	if c := v.Get("usage", "input_tokens_details", "cached_tokens"); c != nil {
		if n, err := c.Int(); err == nil && n >= 0 {
			ex.cached = n
		}
	}
}

var (
	strRespCreated    = []byte(`"response.created"`)
	strRespInProgress = []byte(`"response.in_progress"`)
	strRespQueued     = []byte(`"response.queued"`)
	strRespObject     = []byte(`"response":`)
)

// responsesEvent reads one `data:` payload of a Responses stream (named
// events, vLLM: `event: <type>` then `data: {...,"type":"<type>"}`): it
// stores the response id from the first event carrying the response
// object, takes the first token to be the first event that is not
// response.created / in_progress / queued (vLLM sends those before
// generating), and reads cached tokens from response.completed's usage.
func (ex *exchange) responsesEvent(data []byte) {
	needID := !ex.api.seenID && bytes.Contains(data, strRespObject)
	hasUsage := bytes.Contains(data, strCachedTokens)
	if ex.output && !needID && !hasUsage {
		return // a delta: nothing to read
	}
	v, err := ex.fjParser.ParseBytes(data)
	if err != nil {
		if !ex.output {
			ex.output = true // not an event we know: count it as output
		}
		return
	}
	if !ex.output {
		switch t := v.GetStringBytes("type"); {
		case bytes.Equal(t, strRespCreated[1:len(strRespCreated)-1]),
			bytes.Equal(t, strRespInProgress[1:len(strRespInProgress)-1]),
			bytes.Equal(t, strRespQueued[1:len(strRespQueued)-1]):
		default:
			ex.output = true
		}
	}
	if needID {
		if id := v.GetStringBytes("response", "id"); len(id) > 0 {
			ex.api.seenID = true
			ex.s.api.responses.put(id, ex.rep.name, ex.s.now())
		}
	}
	if hasUsage {
		if c := v.Get("response", "usage", "input_tokens_details", "cached_tokens"); c != nil {
			if n, err := c.Int(); err == nil && n >= 0 {
				ex.cached = n
			}
		}
		if u := v.Get("response", "usage"); u != nil {
			ex.promptRep, ex.outTok = usageCounts(u)
		}
	}
}

// handleAPI dispatches the paths beyond chat, completions, embeddings and
// the model list; false for an unknown path.
func (s *Server) handleAPI(ctx *fasthttp.RequestCtx) bool {
	path := string(ctx.Path())
	switch path {
	case "/v1/responses":
		s.route(ctx, epResponses)
		return true
	case "/version":
		s.version(ctx)
		return true
	}
	if isPassJSON(path) {
		s.route(ctx, epPassJSON)
		return true
	}
	if path == "/v1/audio/transcriptions" || path == "/v1/audio/translations" {
		s.route(ctx, epPassMulti)
		return true
	}
	if rest, ok := strings.CutPrefix(path, "/v1/responses/"); ok && rest != "" {
		s.responseByID(ctx, rest)
		return true
	}
	if rest, ok := strings.CutPrefix(path, "/v1/models/"); ok && rest != "" {
		s.modelByID(ctx, rest)
		return true
	}
	return false
}

// responseByID proxies GET /v1/responses/{id} and POST
// /v1/responses/{id}/cancel to the replica holding id.
func (s *Server) responseByID(ctx *fasthttp.RequestCtx, rest string) {
	id, cancel := strings.CutSuffix(rest, "/cancel")
	method := strGET
	if cancel {
		method = strPOST
	}
	if strings.Contains(id, "/") || id == "" {
		s.reject(ctx, apiUnknownPath, "Invalid URL ("+string(ctx.Method())+" "+string(ctx.Path())+")", "")
		return
	}
	if !bytes.Equal(ctx.Method(), method) {
		s.reject(ctx, apiMethod, "Method "+string(ctx.Method())+" not allowed for "+string(ctx.Path())+"; use "+string(method), "")
		ctx.Response.Header.SetBytesKV(hdrAllow, method)
		return
	}
	name, ok := s.api.responses.get([]byte(id), s.now())
	if !ok {
		name, ok = s.findResponse(ctx, []byte(id), nil)
	}
	if !ok {
		s.reject(ctx, apiResponseNotFound, "Response with id '"+id+"' not found.", "response_id")
		return
	}
	r := s.replicaByName(name)
	switch {
	case r == nil:
		s.reject(ctx, apiResponseGone,
			"Response with id '"+id+"' was held by replica "+name+", which is no longer in the pool.", "response_id")
		return
	case !r.isHealthy():
		s.reject(ctx, apiPrevUnavailable,
			"The replica holding response '"+id+"' is unavailable right now; retry later.", "response_id")
		return
	case r.full():
		s.reject(ctx, apiReplicaLimit,
			"The replica holding response '"+id+"' is at its concurrency limit; retry later.", "")
		return
	}
	stream := !cancel && bytes.Equal(ctx.QueryArgs().Peek("stream"), strTrue)
	s.routeTo(ctx, r, stream)
}

// parse fills ex.prompt from body for ep (and ex.api.prevID for the
// Responses API).
func (s *Server) parse(ctx *fasthttp.RequestCtx, ex *exchange, body []byte) error {
	switch ex.ep {
	case epChat:
		return ex.parser.ParseChat(body, &ex.prompt)
	case epCompletion:
		return ex.parser.ParseCompletion(body, &ex.prompt)
	case epResponses:
		prev, err := ex.parser.ParseResponses(body, &ex.prompt)
		ex.api.prevID = append(ex.api.prevID[:0], prev...)
		return err
	case epPassJSON:
		return s.parsePassJSON(ctx, ex, body)
	case epPassMulti:
		return s.parseMultipart(ctx, ex, body)
	default:
		return ex.parser.ParseEmbedding(body, &ex.prompt)
	}
}
