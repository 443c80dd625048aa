// Long because it is one job: the OpenAI-compatible chat and completion
// handlers, streaming and not, and their validation; extra.go has the other
// endpoints.

package enginesim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// maxBody bounds a request body (a 128k-token prompt is 512 KiB).
const maxBody = 32 << 20

// apiError is an OpenAI-style error body.
type apiError struct {
	Status  int
	Message string
	Type    string
	Param   string // "" encodes as null
	Code    string // "" encodes as null
}

func (e *apiError) Error() string { return e.Message }

func badRequest(param, format string, a ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Message: fmt.Sprintf(format, a...)}
}

func writeError(w http.ResponseWriter, e *apiError) {
	type body struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
	b := body{Message: e.Message, Type: e.Type}
	if e.Param != "" {
		b.Param = &e.Param
	}
	if e.Code != "" {
		b.Code = &e.Code
	}
	writeJSON(w, e.Status, map[string]any{"error": b})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"message":"encode response","type":"internal_error","param":null,"code":null}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// ServeHTTP routes the OpenAI API, health, metrics and admin endpoints.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.enter() {
		writeError(w, &apiError{Status: http.StatusServiceUnavailable, Type: "ServiceUnavailable", Message: "server closing"})
		return
	}
	defer s.leave()
	route := func(method string, h func(http.ResponseWriter, *http.Request)) {
		if r.Method != method && !(method == http.MethodGet && r.Method == http.MethodHead) {
			w.Header().Set("Allow", method)
			writeError(w, &apiError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error",
				Message: fmt.Sprintf("method %s not allowed on %s", r.Method, r.URL.Path)})
			return
		}
		h(w, r)
	}
	switch r.URL.Path {
	case "/v1/chat/completions":
		route(http.MethodPost, s.handleChat)
	case "/v1/completions":
		route(http.MethodPost, s.handleCompletion)
	case "/v1/models":
		route(http.MethodGet, s.handleModels)
	case "/health":
		route(http.MethodGet, s.handleHealth)
	case "/metrics":
		route(http.MethodGet, s.handleMetrics)
	case "/version":
		route(http.MethodGet, func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusOK, map[string]string{"version": "enginesim"})
		})
	case "/admin/faults", "/admin/restart":
		switch {
		case !s.cfg.EnableAdmin:
			writeError(w, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Message: "admin endpoints disabled"})
		case r.URL.Path == "/admin/restart":
			route(http.MethodPost, func(w http.ResponseWriter, _ *http.Request) {
				s.Restart()
				writeJSON(w, http.StatusOK, map[string]any{"restarted": true})
			})
		case r.Method == http.MethodGet:
			writeJSON(w, http.StatusOK, toFaultsJSON(s.Faults()))
		default:
			route(http.MethodPost, s.handleFaults)
		}
	default:
		if !s.serveExtra(w, r) { // extra.go, responses.go
			writeError(w, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error",
				Message: "unknown path " + r.URL.Path})
		}
	}
}

func (s *Server) inject(kind string) {
	s.injected.Add(1)
	s.met.fault[kind].Inc()
}

// applyFaults runs the request-level faults; false means the response is
// already decided (error written, or the request hung until it ended).
func (s *Server) applyFaults(w http.ResponseWriter, r *http.Request, f *Faults) bool {
	if f.Hang {
		s.inject("hang")
		select {
		case <-r.Context().Done():
		case <-s.closing:
		}
		return false
	}
	if f.Latency > 0 {
		s.inject("latency")
		if !s.sleep(r.Context(), time.Duration(float64(f.Latency)*s.cfg.TimeScale)) {
			return false
		}
	}
	if s.decideError(f.ErrorRate) {
		s.inject("error")
		status := f.ErrorStatus
		if status == 0 {
			status = http.StatusInternalServerError
		}
		writeError(w, &apiError{Status: status, Type: "InternalServerError", Message: "injected fault"})
		return false
	}
	return true
}

// closeConn drops the client connection without a response (injected close,
// restart).
func closeConn(w http.ResponseWriter) {
	if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
		c.Close()
	}
}

// streamFault applies CloseAfterChunks and StallAfterChunks before a
// stream's next chunk (chunks sent so far): true when the stream ends
// there, the connection closed or held until the client or the server
// leaves, and the flight aborted.
func (s *Server) streamFault(w http.ResponseWriter, r *http.Request, f *flight, faults *Faults, chunks int) bool {
	if n := faults.CloseAfterChunks; n > 0 && chunks >= n {
		s.inject("close")
		s.abort(f)
		closeConn(w)
		return true
	}
	if n := faults.StallAfterChunks; n > 0 && chunks >= n {
		s.inject("stall")
		select {
		case <-r.Context().Done():
		case <-s.closing:
		}
		s.abort(f)
		return true
	}
	return false
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	if s.Faults().Unhealthy {
		writeError(w, &apiError{Status: http.StatusServiceUnavailable, Type: "ServiceUnavailable", Message: "unhealthy (injected)"})
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	f := s.Faults()
	switch {
	case f.MetricsStall:
		s.inject("metrics_stall")
		select {
		case <-r.Context().Done():
		case <-s.closing:
		}
		return
	case f.MetricsGarbage:
		s.inject("metrics_garbage")
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		io.WriteString(w, "vllm:num_requests_waiting{model_name=\"\n}}} 1e+x not prometheus\n\x00")
		return
	}
	promhttp.HandlerFor(s.met.reg, promhttp.HandlerOpts{}).ServeHTTP(w, r)
}

type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen int     `json:"max_model_len"`
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	created := s.epoch.Unix()
	var data []modelCard
	for _, n := range s.cfg.ServedModelNames {
		data = append(data, modelCard{ID: n, Object: "model", Created: created, OwnedBy: "vllm", Root: s.base, MaxModelLen: s.cfg.MaxModelLen})
	}
	for i, n := range s.cfg.loraNames() {
		root := n
		if _, path, ok := strings.Cut(s.cfg.LoRAModules[i], "="); ok {
			root = path
		}
		data = append(data, modelCard{ID: n, Object: "model", Created: created, OwnedBy: "vllm", Root: root, Parent: &s.base, MaxModelLen: s.cfg.MaxModelLen})
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// faultsJSON is the admin wire form of Faults (latency in milliseconds of
// model time).
type faultsJSON struct {
	LatencyMS        float64 `json:"latency_ms"`
	ErrorRate        float64 `json:"error_rate"`
	ErrorStatus      int     `json:"error_status"`
	Hang             bool    `json:"hang"`
	CloseAfterChunks int     `json:"close_after_chunks"`
	StallAfterChunks int     `json:"stall_after_chunks"`
	MetricsGarbage   bool    `json:"metrics_garbage"`
	MetricsStall     bool    `json:"metrics_stall"`
	Unhealthy        bool    `json:"unhealthy"`
}

func toFaultsJSON(f Faults) faultsJSON {
	return faultsJSON{float64(f.Latency) / 1e6, f.ErrorRate, f.ErrorStatus, f.Hang, f.CloseAfterChunks, f.StallAfterChunks,
		f.MetricsGarbage, f.MetricsStall, f.Unhealthy}
}

func (s *Server) handleFaults(w http.ResponseWriter, r *http.Request) {
	var in faultsJSON
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		writeError(w, decodeError(err))
		return
	}
	f := Faults{Latency: time.Duration(in.LatencyMS * 1e6), ErrorRate: in.ErrorRate, ErrorStatus: in.ErrorStatus,
		Hang: in.Hang, CloseAfterChunks: in.CloseAfterChunks, StallAfterChunks: in.StallAfterChunks, MetricsGarbage: in.MetricsGarbage,
		MetricsStall: in.MetricsStall, Unhealthy: in.Unhealthy}
	if err := f.validate(); err != nil {
		writeError(w, badRequest("", "%v", err))
		return
	}
	s.SetFaults(f)
	writeJSON(w, http.StatusOK, toFaultsJSON(f))
}

// decodeError maps a JSON decoding error to a 400 naming the field.
func decodeError(err error) *apiError {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	var me *http.MaxBytesError
	switch {
	case errors.As(err, &te):
		return badRequest(te.Field, "invalid type for %q: expected %s, got JSON %s", te.Field, te.Type, te.Value)
	case errors.As(err, &se):
		return badRequest("", "invalid JSON body: %v", err)
	case errors.As(err, &me):
		return &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Message: "request body too large"}
	case errors.Is(err, io.EOF):
		return badRequest("", "empty request body")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		f := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return badRequest(f, "unknown field %q", f)
	}
	return badRequest("", "invalid JSON body: %v", err)
}

// Wire types: only what the engine uses; other OpenAI fields are accepted
// and ignored, as vLLM does.
type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatMessage struct {
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	ToolCalls json.RawMessage `json:"tool_calls"`
}

type chatRequest struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	N                   *int            `json:"n"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	CacheSalt           *string         `json:"cache_salt"`
	Tools               json.RawMessage `json:"tools"`
}

type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	MaxTokens     *int            `json:"max_tokens"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	N             *int            `json:"n"`
	Temperature   *float64        `json:"temperature"`
	TopP          *float64        `json:"top_p"`
	CacheSalt     *string         `json:"cache_salt"`
}

// apiCall is a parsed request, whichever the endpoint.
type apiCall struct {
	chat         bool
	model        string
	adapter      string
	prompt       []byte
	maxTokens    int // 0: sampled
	maxParam     string
	promptParam  string
	stream       bool
	includeUsage bool
	salt         string
}

var validRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true, "function": true}

func parseBody(r *http.Request, w http.ResponseWriter, v any) *apiError {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	if dec.More() {
		return badRequest("", "invalid JSON body: trailing data after the object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("", "invalid JSON body: trailing data after the object")
	}
	return nil
}

// common validates the fields chat and completions share.
func (s *Server) common(c *apiCall, model string, n *int, temp, topP *float64, salt *string, stream bool, so *streamOptions) *apiError {
	if model == "" {
		return badRequest("model", "model is required")
	}
	mi, ok := s.models[model]
	if !ok {
		return &apiError{Status: http.StatusNotFound, Type: "NotFoundError", Param: "model", Code: "model_not_found",
			Message: fmt.Sprintf("The model `%s` does not exist.", model)}
	}
	c.model, c.adapter = model, mi.adapter
	if n != nil && *n != 1 {
		return badRequest("n", "n must be 1 (got %d)", *n)
	}
	if temp != nil && (*temp < 0 || *temp > 2) {
		return badRequest("temperature", "temperature must be in [0, 2] (got %v)", *temp)
	}
	if topP != nil && (*topP <= 0 || *topP > 1) {
		return badRequest("top_p", "top_p must be in (0, 1] (got %v)", *topP)
	}
	if salt != nil {
		if *salt == "" {
			return badRequest("cache_salt", "Parameter 'cache_salt' must be a non-empty string if provided.")
		}
		c.salt = *salt
	}
	if so != nil && !stream {
		return badRequest("stream_options", "Stream options can only be defined when `stream=True`.")
	}
	c.stream = stream
	c.includeUsage = so != nil && so.IncludeUsage
	return nil
}

func (s *Server) parseChat(w http.ResponseWriter, r *http.Request) (*apiCall, *apiError) {
	var req chatRequest
	if e := parseBody(r, w, &req); e != nil {
		return nil, e
	}
	c := &apiCall{chat: true, promptParam: "messages"}
	if e := s.common(c, req.Model, req.N, req.Temperature, req.TopP, req.CacheSalt, req.Stream, req.StreamOptions); e != nil {
		return nil, e
	}
	if len(req.Messages) == 0 {
		return nil, badRequest("messages", "messages must be a non-empty array")
	}
	msgs := make([]Message, len(req.Messages))
	for i, m := range req.Messages {
		if !validRoles[m.Role] {
			return nil, badRequest(fmt.Sprintf("messages[%d].role", i), "invalid role %q", m.Role)
		}
		text, err := messageText(m)
		if err != "" {
			return nil, badRequest(fmt.Sprintf("messages[%d].content", i), "%s", err)
		}
		msgs[i] = Message{Role: m.Role, Content: text}
	}
	tools := bytes.TrimSpace(req.Tools)
	if bytes.Equal(tools, []byte("null")) {
		tools = nil
	}
	if len(tools) > 0 && tools[0] != '[' {
		return nil, badRequest("tools", "tools must be an array")
	}
	c.prompt = AppendChatPrompt(nil, msgs, tools)
	switch {
	case req.MaxCompletionTokens != nil:
		c.maxTokens, c.maxParam = *req.MaxCompletionTokens, "max_completion_tokens"
	case req.MaxTokens != nil:
		c.maxTokens, c.maxParam = *req.MaxTokens, "max_tokens"
	}
	if c.maxParam != "" && c.maxTokens < 1 {
		return nil, badRequest(c.maxParam, "%s must be at least 1, got %d.", c.maxParam, c.maxTokens)
	}
	return c, s.checkLength(c)
}

// messageText flattens a message's content (string, text parts or null).
func messageText(m chatMessage) (string, string) {
	raw := bytes.TrimSpace(m.Content)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		if m.Role == "assistant" && len(m.ToolCalls) > 0 {
			return string(m.ToolCalls), ""
		}
		if m.Role == "assistant" {
			return "", ""
		}
		return "", "content is required"
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", "invalid string content"
		}
		return s, ""
	case '[':
		var parts []struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", "content must be a string or an array of content parts"
		}
		var b strings.Builder
		for i, p := range parts {
			if p.Type != "text" || p.Text == nil {
				return "", fmt.Sprintf("content part %d: only text parts are supported (got type %q)", i, p.Type)
			}
			if i > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(*p.Text)
		}
		return b.String(), ""
	}
	return "", "content must be a string or an array of content parts"
}

func (s *Server) parseCompletion(w http.ResponseWriter, r *http.Request) (*apiCall, *apiError) {
	var req completionRequest
	if e := parseBody(r, w, &req); e != nil {
		return nil, e
	}
	c := &apiCall{promptParam: "prompt", maxTokens: 16, maxParam: "max_tokens"}
	if e := s.common(c, req.Model, req.N, req.Temperature, req.TopP, req.CacheSalt, req.Stream, req.StreamOptions); e != nil {
		return nil, e
	}
	raw := bytes.TrimSpace(req.Prompt)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("prompt", "prompt is required")
	}
	var str string
	var strs []string
	var ids []int64
	switch {
	case json.Unmarshal(raw, &str) == nil:
		c.prompt = []byte(str)
	case json.Unmarshal(raw, &strs) == nil:
		if len(strs) != 1 {
			return nil, badRequest("prompt", "exactly one prompt is supported (got %d)", len(strs))
		}
		c.prompt = []byte(strs[0])
	case json.Unmarshal(raw, &ids) == nil:
		for _, id := range ids { // token ids: 4 bytes each, as the tokenizer sees them
			if id < 0 || id > 0xffffffff {
				return nil, badRequest("prompt", "token id %d out of range", id)
			}
			c.prompt = append(c.prompt, byte(id), byte(id>>8), byte(id>>16), byte(id>>24))
		}
	default:
		return nil, badRequest("prompt", "prompt must be a string, an array of one string, or an array of token ids")
	}
	if len(c.prompt) == 0 {
		return nil, badRequest("prompt", "prompt must not be empty")
	}
	if req.MaxTokens != nil {
		c.maxTokens = *req.MaxTokens
		if c.maxTokens < 1 {
			return nil, badRequest("max_tokens", "max_tokens must be at least 1, got %d.", c.maxTokens)
		}
	}
	return c, s.checkLength(c)
}

// checkLength rejects prompts the engine cannot take, with vLLM's wording.
func (s *Server) checkLength(c *apiCall) *apiError {
	p := tokensOf(len(c.prompt))
	ml := s.cfg.MaxModelLen
	if p >= ml || p+c.maxTokens > ml {
		param := c.promptParam
		if p < ml {
			param = c.maxParam
		}
		return badRequest(param, "This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the %s, %d in the completion). Please reduce the length of the %s or completion.",
			ml, p+c.maxTokens, p, c.promptParam, c.maxTokens, c.promptParam)
	}
	if capTok := s.cfg.NumGPUBlocks * s.cfg.BlockSize; p+max(c.maxTokens, 1)-1 > capTok {
		return badRequest(c.promptParam, "request needs %d tokens of KV cache but the cache holds %d", p+c.maxTokens, capTok)
	}
	return nil
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	s.handleAPI(w, r, s.parseChat)
}

func (s *Server) handleCompletion(w http.ResponseWriter, r *http.Request) {
	s.handleAPI(w, r, s.parseCompletion)
}

type parser func(http.ResponseWriter, *http.Request) (*apiCall, *apiError)

func (s *Server) handleAPI(w http.ResponseWriter, r *http.Request, parse parser) {
	defer s.countCancelled(r)
	faults := s.Faults()
	if !s.applyFaults(w, r, &faults) {
		return
	}
	c, e := parse(w, r)
	if e != nil {
		writeError(w, e)
		return
	}
	f := &flight{notify: make(chan struct{}, 1)}
	f.req = Request{Prompt: c.prompt, Adapter: c.adapter, CacheSalt: c.salt, MaxTokens: c.maxTokens}
	if err := s.submit(f); err != nil {
		if errors.Is(err, errClosed) {
			writeError(w, &apiError{Status: http.StatusServiceUnavailable, Type: "ServiceUnavailable", Message: "server closing"})
			return
		}
		writeError(w, badRequest(c.promptParam, "%v", err))
		return
	}
	if c.stream {
		s.stream(w, r, c, f, &faults)
	} else {
		s.respond(w, r, c, f, faults.CloseAfterChunks > 0)
	}
}

// countCancelled counts a request whose client connection closed (net/http
// cancels the request's context) before its handler returned.
func (s *Server) countCancelled(r *http.Request) {
	if r.Context().Err() != nil {
		s.cancelled.Add(1)
	}
}

// wait blocks until f changes, the client leaves or the server closes.
func (s *Server) wait(r *http.Request, f *flight) bool {
	select {
	case <-f.notify:
		return true
	case <-r.Context().Done():
	case <-s.closing:
	}
	s.abort(f)
	return false
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func makeUsage(f *flight, st flightState) *usage {
	u := &usage{PromptTokens: f.req.PromptTokens, CompletionTokens: st.tokens, TotalTokens: f.req.PromptTokens + st.tokens}
	u.PromptTokensDetails.CachedTokens = st.cached
	return u
}

func (s *Server) respond(w http.ResponseWriter, r *http.Request, c *apiCall, f *flight, cut bool) {
	var st flightState
	for st = f.state(); !st.done; st = f.state() {
		if !s.wait(r, f) {
			return
		}
	}
	if st.err != nil || cut {
		if cut {
			s.inject("close")
		}
		closeConn(w)
		return
	}
	text := string(f.req.AppendOutput(nil, 0, st.tokens))
	reason := st.finish.String()
	id, created := strconv.FormatUint(f.req.ID, 16), time.Now().Unix()
	var resp map[string]any
	if c.chat {
		resp = map[string]any{"id": "chatcmpl-" + id, "object": "chat.completion", "created": created, "model": c.model,
			"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": text},
				"logprobs": nil, "finish_reason": reason}},
			"usage": makeUsage(f, st)}
	} else {
		resp = map[string]any{"id": "cmpl-" + id, "object": "text_completion", "created": created, "model": c.model,
			"choices": []any{map[string]any{"index": 0, "text": text, "logprobs": nil, "finish_reason": reason}},
			"usage":   makeUsage(f, st)}
	}
	s.served[c.model].Add(1) // before the write: a client that has the body sees the count
	writeJSON(w, http.StatusOK, resp)
}

// chunk is one streamed event; Delta for chat, Text for completions.
type chunk struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []chunkChoice `json:"choices"`
	Usage   *usage        `json:"usage,omitempty"`
}

type chunkChoice struct {
	Index        int     `json:"index"`
	Delta        *delta  `json:"delta,omitempty"`
	Text         *string `json:"text,omitempty"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

type delta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

func (s *Server) stream(w http.ResponseWriter, r *http.Request, c *apiCall, f *flight, faults *Faults) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	ch := chunk{Created: time.Now().Unix(), Model: c.model, Choices: make([]chunkChoice, 1)}
	id := strconv.FormatUint(f.req.ID, 16)
	if c.chat {
		ch.ID, ch.Object = "chatcmpl-"+id, "chat.completion.chunk"
	} else {
		ch.ID, ch.Object = "cmpl-"+id, "text_completion"
	}
	var buf []byte
	send := func() bool {
		b, err := json.Marshal(&ch)
		if err != nil {
			return false
		}
		buf = append(append(append(buf[:0], "data: "...), b...), "\n\n"...)
		if _, err := w.Write(buf); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	content := func(text string, finish *string) {
		ch.Choices[0] = chunkChoice{FinishReason: finish}
		if c.chat {
			ch.Choices[0].Delta = &delta{Content: &text}
			if finish != nil && text == "" {
				ch.Choices[0].Delta = &delta{}
			}
		} else {
			ch.Choices[0].Text = &text
		}
	}
	if c.chat { // the role chunk
		empty := ""
		ch.Choices[0] = chunkChoice{Delta: &delta{Role: "assistant", Content: &empty}}
		if !send() {
			s.abort(f)
			return
		}
	}
	sent, chunks := 0, 0
	var tok []byte
	for {
		st := f.state()
		if st.err != nil {
			closeConn(w)
			return
		}
		for ; sent < st.tokens; sent++ {
			if f.req.IsEOS(sent) {
				continue
			}
			if s.streamFault(w, r, f, faults, chunks) {
				return
			}
			tok = f.req.AppendOutput(tok[:0], sent, sent+1)
			content(string(tok), nil)
			if !send() {
				s.abort(f)
				return
			}
			chunks++
		}
		if st.done {
			s.served[c.model].Add(1) // before [DONE]: a client that saw it sees the count
			reason := st.finish.String()
			content("", &reason)
			if !send() {
				return
			}
			if c.includeUsage {
				ch.Choices = ch.Choices[:0]
				ch.Usage = makeUsage(f, st)
				if !send() {
					return
				}
			}
			w.Write([]byte("data: [DONE]\n\n"))
			rc.Flush()
			return
		}
		if !s.wait(r, f) {
			return
		}
	}
}
