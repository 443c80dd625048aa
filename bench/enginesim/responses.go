package enginesim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The Responses API as vLLM serves it (vllm/entrypoints/openai/responses):
// `instructions` becomes a system message, `input` (a string or message
// items) the rest, rendered through the chat template and run on the engine
// like a chat request. Every completed response is stored (vLLM with
// VLLM_ENABLE_RESPONSES_API_STORE=1): a later request naming it in
// `previous_response_id` continues that conversation (its messages plus the
// answer come first, so the engine's prefix cache serves them), and
// GET /v1/responses/{id} returns it. An unknown id is vLLM's 404
// "Response with id '...' not found." (param response_id). The store keeps
// the last maxStoredResponses responses of this process: a restarted or
// different replica does not know them.

const maxStoredResponses = 4096

type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	PreviousResponseID *string         `json:"previous_response_id"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Stream             bool            `json:"stream"`
	Temperature        *float64        `json:"temperature"`
	TopP               *float64        `json:"top_p"`
	CacheSalt          *string         `json:"cache_salt"`
	Store              *bool           `json:"store"`
}

// storedResponse is what a later previous_response_id continues from.
type storedResponse struct {
	msgs []Message // the conversation including the answer
	body map[string]any
}

type responseStore struct {
	mu    sync.Mutex
	m     map[string]*storedResponse
	order []string
}

func (st *responseStore) get(id string) *storedResponse {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.m[id]
}

func (st *responseStore) put(id string, r *storedResponse) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.m == nil {
		st.m = map[string]*storedResponse{}
	}
	if len(st.order) >= maxStoredResponses {
		delete(st.m, st.order[0])
		st.order = st.order[1:]
	}
	st.m[id] = r
	st.order = append(st.order, id)
}

func responseNotFound(id string) *apiError {
	return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "response_id",
		Message: fmt.Sprintf("Response with id '%s' not found.", id)}
}

// parseResponses validates a /v1/responses body into the call and its
// conversation.
func (s *Server) parseResponses(w http.ResponseWriter, r *http.Request) (*apiCall, []Message, *apiError) {
	var req responsesRequest
	if e := parseBody(r, w, &req); e != nil {
		return nil, nil, e
	}
	c := &apiCall{chat: true, promptParam: "input"}
	if e := s.common(c, req.Model, nil, req.Temperature, req.TopP, req.CacheSalt, req.Stream, nil); e != nil {
		return nil, nil, e
	}
	var msgs []Message
	if req.PreviousResponseID != nil {
		prev := s.responses.get(*req.PreviousResponseID)
		if prev == nil {
			return nil, nil, responseNotFound(*req.PreviousResponseID)
		}
		msgs = append(msgs, prev.msgs...)
	} else if req.Instructions != nil && *req.Instructions != "" {
		msgs = append(msgs, Message{Role: "system", Content: *req.Instructions})
	}
	in, e := responsesInput(req.Input)
	if e != nil {
		return nil, nil, e
	}
	msgs = append(msgs, in...)
	c.prompt = AppendChatPrompt(nil, msgs, nil)
	if req.MaxOutputTokens != nil {
		c.maxTokens, c.maxParam = *req.MaxOutputTokens, "max_output_tokens"
		if c.maxTokens < 1 {
			return nil, nil, badRequest("max_output_tokens", "max_output_tokens must be at least 1, got %d.", c.maxTokens)
		}
	}
	return c, msgs, s.checkLength(c)
}

// responsesInput turns `input` into messages: a string is one user message;
// an array holds message items (string content or parts with `text`).
func responsesInput(raw json.RawMessage) ([]Message, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("input", "input is required")
	}
	var str string
	if json.Unmarshal(raw, &str) == nil {
		return []Message{{Role: "user", Content: str}}, nil
	}
	var items []struct {
		Type    string          `json:"type"`
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, badRequest("input", "input must be a string or an array of input items")
	}
	var msgs []Message
	for i, it := range items {
		if it.Type != "" && it.Type != "message" {
			return nil, badRequest(fmt.Sprintf("input[%d].type", i), "only message items are supported (got type %q)", it.Type)
		}
		if !validRoles[it.Role] {
			return nil, badRequest(fmt.Sprintf("input[%d].role", i), "invalid role %q", it.Role)
		}
		text, err := partsText(it.Content)
		if err != "" {
			return nil, badRequest(fmt.Sprintf("input[%d].content", i), "%s", err)
		}
		msgs = append(msgs, Message{Role: it.Role, Content: text})
	}
	return msgs, nil
}

func partsText(raw json.RawMessage) (string, string) {
	raw = bytes.TrimSpace(raw)
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, ""
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", "content must be a string or an array of content parts"
	}
	var b strings.Builder
	for i, p := range parts {
		if p.Text == nil {
			return "", fmt.Sprintf("content part %d: only text parts are supported (got type %q)", i, p.Type)
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(*p.Text)
	}
	return b.String(), ""
}

func (s *Server) handleResponses(w http.ResponseWriter, r *http.Request) {
	defer s.countCancelled(r)
	faults := s.Faults()
	if !s.applyFaults(w, r, &faults) {
		return
	}
	c, msgs, e := s.parseResponses(w, r)
	if e != nil {
		writeError(w, e)
		return
	}
	f := &flight{notify: make(chan struct{}, 1)}
	f.req = Request{Prompt: c.prompt, Adapter: c.adapter, CacheSalt: c.salt, MaxTokens: c.maxTokens}
	if err := s.submit(f); err != nil {
		writeError(w, badRequest(c.promptParam, "%v", err))
		return
	}
	id := "resp_" + strconv.FormatUint(f.req.ID, 16) + strconv.FormatInt(s.epoch.UnixNano()%1e9, 36)
	created := time.Now().Unix()
	if c.stream {
		s.streamResponse(w, r, c, f, msgs, id, created, &faults)
		return
	}
	var st flightState
	for st = f.state(); !st.done; st = f.state() {
		if !s.wait(r, f) {
			return
		}
	}
	if st.err != nil {
		closeConn(w)
		return
	}
	text := string(f.req.AppendOutput(nil, 0, st.tokens))
	body := s.responseBody(c, f, st, id, created, "completed", text)
	s.responses.put(id, &storedResponse{msgs: append(msgs, Message{Role: "assistant", Content: text}), body: body})
	s.served[c.model].Add(1)
	writeJSON(w, http.StatusOK, body)
}

// responseBody is a ResponsesResponse (the fields clients read).
func (s *Server) responseBody(c *apiCall, f *flight, st flightState, id string, created int64, status, text string) map[string]any {
	var output []any
	var usage any
	if status != "in_progress" {
		if st.finish.String() == "length" {
			status = "incomplete"
		}
		output = []any{outputMessage(id, text, "completed")}
		usage = map[string]any{
			"input_tokens": f.req.PromptTokens, "output_tokens": st.tokens, "total_tokens": f.req.PromptTokens + st.tokens,
			"input_tokens_details":  map[string]any{"cached_tokens": st.cached},
			"output_tokens_details": map[string]any{"reasoning_tokens": 0},
		}
	}
	if output == nil {
		output = []any{}
	}
	return map[string]any{"id": id, "object": "response", "created_at": created, "model": c.model, "status": status,
		"output": output, "usage": usage, "parallel_tool_calls": true, "tool_choice": "auto", "tools": []any{},
		"text": map[string]any{"format": map[string]any{"type": "text"}}, "error": nil, "incomplete_details": nil,
		"instructions": nil, "metadata": nil, "temperature": 1.0, "top_p": 1.0, "truncation": "disabled"}
}

func outputMessage(id, text, status string) map[string]any {
	content := []any{}
	if status == "completed" {
		content = []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}
	}
	return map[string]any{"id": "msg_" + id, "type": "message", "role": "assistant", "status": status, "content": content}
}

// streamResponse sends vLLM's named events: response.created,
// response.in_progress, then with the first token response.output_item.added
// and response.content_part.added, one response.output_text.delta per token,
// then the .done events and response.completed (usage with cached tokens).
// An engine failure mid-stream ends with an `error` event.
func (s *Server) streamResponse(w http.ResponseWriter, r *http.Request, c *apiCall, f *flight, msgs []Message, id string, created int64, faults *Faults) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	seq := 0
	send := func(typ string, ev map[string]any) bool {
		ev["type"], ev["sequence_number"] = typ, seq
		seq++
		b, err := json.Marshal(ev)
		if err != nil {
			return false
		}
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	initial := s.responseBody(c, f, flightState{}, id, created, "in_progress", "")
	if !send("response.created", map[string]any{"response": initial}) || !send("response.in_progress", map[string]any{"response": initial}) {
		s.abort(f)
		return
	}
	item := "msg_" + id
	sent, chunks := 0, 0
	var text, tok []byte
	opened := false
	for {
		st := f.state()
		if st.err != nil {
			send("error", map[string]any{"code": "engine_error", "message": st.err.Error(), "param": nil})
			return
		}
		for ; sent < st.tokens; sent++ {
			if f.req.IsEOS(sent) {
				continue
			}
			if s.streamFault(w, r, f, faults, chunks) {
				return
			}
			if !opened {
				opened = true
				if !send("response.output_item.added", map[string]any{"output_index": 0, "item": outputMessage(id, "", "in_progress")}) ||
					!send("response.content_part.added", map[string]any{"output_index": 0, "item_id": item, "content_index": 0,
						"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}}) {
					s.abort(f)
					return
				}
			}
			tok = f.req.AppendOutput(tok[:0], sent, sent+1)
			text = append(text, tok...)
			if !send("response.output_text.delta", map[string]any{"output_index": 0, "item_id": item, "content_index": 0,
				"delta": string(tok), "logprobs": []any{}}) {
				s.abort(f)
				return
			}
			chunks++
		}
		if st.done {
			s.served[c.model].Add(1)
			final := s.responseBody(c, f, st, id, created, "completed", string(text))
			s.responses.put(id, &storedResponse{msgs: append(msgs, Message{Role: "assistant", Content: string(text)}), body: final})
			if opened {
				send("response.output_text.done", map[string]any{"output_index": 0, "item_id": item, "content_index": 0, "text": string(text), "logprobs": []any{}})
				send("response.content_part.done", map[string]any{"output_index": 0, "item_id": item, "content_index": 0,
					"part": map[string]any{"type": "output_text", "text": string(text), "annotations": []any{}}})
				send("response.output_item.done", map[string]any{"output_index": 0, "item": outputMessage(id, string(text), "completed")})
			}
			send("response.completed", map[string]any{"response": final})
			return
		}
		if !s.wait(r, f) {
			return
		}
	}
}

// handleResponseByID serves GET /v1/responses/{id} and POST
// /v1/responses/{id}/cancel (every stored response is complete: vLLM's
// 400 "Cannot cancel a synchronous response.").
func (s *Server) handleResponseByID(w http.ResponseWriter, r *http.Request, rest string) {
	id, cancel := strings.CutSuffix(rest, "/cancel")
	want := http.MethodGet
	if cancel {
		want = http.MethodPost
	}
	if r.Method != want {
		w.Header().Set("Allow", want)
		writeError(w, &apiError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Message: fmt.Sprintf("method %s not allowed on %s", r.Method, r.URL.Path)})
		return
	}
	st := s.responses.get(id)
	switch {
	case st == nil:
		writeError(w, responseNotFound(id))
	case cancel:
		writeError(w, badRequest("response_id", "Cannot cancel a synchronous response."))
	default:
		writeJSON(w, http.StatusOK, st.body)
	}
}
