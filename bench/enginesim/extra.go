package enginesim

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// vLLM's endpoints beyond generation, answered in vLLM's shapes without
// touching the engine (they cost no simulated GPU time): /tokenize,
// /detokenize, /v1/rerank (/rerank, /v2/rerank), /v1/score (/score),
// /pooling, /v1/audio/transcriptions and /translations (multipart).
// Tokens are the tokenizer's 4-byte chunks, id = the chunk as a
// little-endian uint32, so /detokenize inverts /tokenize exactly. Scores and
// pooled vectors are deterministic functions of the text.

// serveExtra routes the paths above; false for an unknown path.
func (s *Server) serveExtra(w http.ResponseWriter, r *http.Request) bool {
	post := func(h func(http.ResponseWriter, *http.Request)) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeError(w, &apiError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error",
				Message: fmt.Sprintf("method %s not allowed on %s", r.Method, r.URL.Path)})
			return
		}
		h(w, r)
	}
	switch p := r.URL.Path; {
	case p == "/v1/responses":
		post(s.handleResponses)
	case strings.HasPrefix(p, "/v1/responses/"):
		s.handleResponseByID(w, r, strings.TrimPrefix(p, "/v1/responses/"))
	case p == "/tokenize":
		post(s.handleTokenize)
	case p == "/detokenize":
		post(s.handleDetokenize)
	case p == "/v1/rerank" || p == "/rerank" || p == "/v2/rerank":
		post(s.handleRerank)
	case p == "/v1/score" || p == "/score":
		post(s.handleScore)
	case p == "/pooling":
		post(s.handlePooling)
	case p == "/v1/audio/transcriptions" || p == "/v1/audio/translations":
		post(s.handleAudio)
	default:
		return false
	}
	return true
}

// model resolves an optional model field: "" is the first served name.
func (s *Server) model(m string) (string, *apiError) {
	if m == "" {
		return s.base, nil
	}
	if _, ok := s.models[m]; !ok {
		return "", &apiError{Status: http.StatusNotFound, Type: "NotFoundError", Param: "model", Code: "model_not_found",
			Message: fmt.Sprintf("The model `%s` does not exist.", m)}
	}
	return m, nil
}

// decodeModel decodes r's JSON body into req and resolves *model, a field
// of req; on a bad body or an unknown model it writes the error and
// returns false.
func (s *Server) decodeModel(w http.ResponseWriter, r *http.Request, req any, model *string) (string, bool) {
	if e := parseBody(r, w, req); e != nil {
		writeError(w, e)
		return "", false
	}
	m, e := s.model(*model)
	if e != nil {
		writeError(w, e)
		return "", false
	}
	return m, true
}

// answer counts a request served for model m and writes body as JSON.
func (s *Server) answer(w http.ResponseWriter, m string, body any) {
	s.served[m].Add(1)
	writeJSON(w, http.StatusOK, body)
}

// answerList answers with an OpenAI list object of data, vLLM's shape
// for /score and /pooling; tokens is the prompt's token count.
func (s *Server) answerList(w http.ResponseWriter, m, idPrefix string, data []any, tokens int) {
	s.answer(w, m, map[string]any{"id": idPrefix + s.reqID(), "object": "list", "created": time.Now().Unix(), "model": m,
		"data": data, "usage": map[string]int{"prompt_tokens": tokens, "total_tokens": tokens}})
}

// tokenIDs splits b into the tokenizer's tokens.
func tokenIDs(b []byte) []uint32 {
	ids := make([]uint32, 0, tokensOf(len(b)))
	for i := 0; i < len(b); i += BytesPerToken {
		var t [4]byte
		copy(t[:], b[i:])
		ids = append(ids, binary.LittleEndian.Uint32(t[:]))
	}
	return ids
}

func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model    string          `json:"model"`
		Prompt   *string         `json:"prompt"`
		Messages []chatMessage   `json:"messages"`
		Tools    json.RawMessage `json:"tools"`
	}
	m, ok := s.decodeModel(w, r, &req, &req.Model)
	if !ok {
		return
	}
	var text []byte
	switch {
	case req.Prompt != nil:
		text = []byte(*req.Prompt)
	case len(req.Messages) > 0:
		msgs := make([]Message, len(req.Messages))
		for i, cm := range req.Messages {
			t, err := messageText(cm)
			if err != "" {
				writeError(w, badRequest(fmt.Sprintf("messages[%d].content", i), "%s", err))
				return
			}
			msgs[i] = Message{Role: cm.Role, Content: t}
		}
		text = AppendChatPrompt(nil, msgs, nil)
	default:
		writeError(w, badRequest("prompt", "either prompt or messages is required"))
		return
	}
	ids := tokenIDs(text)
	s.answer(w, m, map[string]any{"count": len(ids), "max_model_len": s.cfg.MaxModelLen, "tokens": ids, "token_strs": nil})
}

func (s *Server) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model  string   `json:"model"`
		Tokens []uint32 `json:"tokens"`
	}
	m, ok := s.decodeModel(w, r, &req, &req.Model)
	if !ok {
		return
	}
	if req.Tokens == nil {
		writeError(w, badRequest("tokens", "tokens is required"))
		return
	}
	b := make([]byte, 0, 4*len(req.Tokens))
	for _, t := range req.Tokens {
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	s.answer(w, m, map[string]any{"prompt": strings.TrimRight(string(b), "\x00")})
}

// similarity is the fraction of a's words found in b (a toy relevance).
func similarity(a, b string) float64 {
	qa := strings.Fields(strings.ToLower(a))
	if len(qa) == 0 {
		return 0
	}
	lb := strings.ToLower(b)
	n := 0
	for _, w := range qa {
		if strings.Contains(lb, w) {
			n++
		}
	}
	return float64(n) / float64(len(qa))
}

func (s *Server) handleRerank(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model     string   `json:"model"`
		Query     *string  `json:"query"`
		Documents []string `json:"documents"`
		TopN      int      `json:"top_n"`
	}
	m, ok := s.decodeModel(w, r, &req, &req.Model)
	if !ok {
		return
	}
	if req.Query == nil || len(req.Documents) == 0 {
		writeError(w, badRequest("documents", "query and a non-empty documents list are required"))
		return
	}
	type result struct {
		Index          int               `json:"index"`
		Document       map[string]string `json:"document"`
		RelevanceScore float64           `json:"relevance_score"`
	}
	res := make([]result, len(req.Documents))
	tokens := tokensOf(len(*req.Query))
	for i, d := range req.Documents {
		res[i] = result{Index: i, Document: map[string]string{"text": d}, RelevanceScore: similarity(*req.Query, d)}
		tokens += tokensOf(len(d))
	}
	// stable sort by score, best first
	for i := 1; i < len(res); i++ {
		for j := i; j > 0 && res[j].RelevanceScore > res[j-1].RelevanceScore; j-- {
			res[j], res[j-1] = res[j-1], res[j]
		}
	}
	if req.TopN > 0 && req.TopN < len(res) {
		res = res[:req.TopN]
	}
	s.answer(w, m, map[string]any{"id": "rerank-" + s.reqID(), "model": m, "usage": map[string]int{"total_tokens": tokens}, "results": res})
}

// texts decodes a string or an array of strings.
func texts(raw json.RawMessage) ([]string, bool) {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return []string{one}, true
	}
	var many []string
	if json.Unmarshal(raw, &many) == nil && len(many) > 0 {
		return many, true
	}
	return nil, false
}

func (s *Server) handleScore(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model string          `json:"model"`
		Text1 json.RawMessage `json:"text_1"`
		Text2 json.RawMessage `json:"text_2"`
	}
	m, ok := s.decodeModel(w, r, &req, &req.Model)
	if !ok {
		return
	}
	t1, ok1 := texts(req.Text1)
	t2, ok2 := texts(req.Text2)
	if !ok1 || !ok2 || (len(t1) != 1 && len(t1) != len(t2)) {
		writeError(w, badRequest("text_1", "text_1 and text_2 must be strings or lists (text_1 of one, or as long as text_2)"))
		return
	}
	var data []any
	tokens := 0
	for i, b := range t2 {
		a := t1[0]
		if len(t1) > 1 {
			a = t1[i]
		}
		tokens += tokensOf(len(a)) + tokensOf(len(b))
		data = append(data, map[string]any{"index": i, "object": "score", "score": similarity(a, b)})
	}
	s.answerList(w, m, "score-", data, tokens)
}

func (s *Server) handlePooling(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model string          `json:"model"`
		Input json.RawMessage `json:"input"`
	}
	m, ok := s.decodeModel(w, r, &req, &req.Model)
	if !ok {
		return
	}
	in, ok := texts(req.Input)
	if !ok {
		writeError(w, badRequest("input", "input must be a string or a list of strings"))
		return
	}
	var data []any
	tokens := 0
	for i, t := range in {
		tokens += tokensOf(len(t))
		vec := make([]float64, 8)
		for j := range vec {
			vec[j] = float64(int64(splitmix64(uint64(len(t))*31+uint64(j))%2000)-1000) / 1000
		}
		data = append(data, map[string]any{"index": i, "object": "pooling", "data": vec})
	}
	s.answerList(w, m, "pool-", data, tokens)
}

// handleAudio answers a transcription or translation: multipart with a
// `file` part and a `model` field (vLLM's form); the text says how many
// bytes of audio arrived, so a test sees the upload went through whole.
// `stream=true` sends transcription.chunk SSE events and [DONE].
func (s *Server) handleAudio(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	mr, err := r.MultipartReader()
	if err != nil {
		writeError(w, badRequest("file", "expected a multipart/form-data body: %v", err))
		return
	}
	var model, stream string
	size := -1
	var sum uint64
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			writeError(w, badRequest("file", "malformed multipart body: %v", err))
			return
		}
		switch p.FormName() {
		case "file":
			b, err := io.ReadAll(p)
			if err != nil {
				writeError(w, badRequest("file", "reading file: %v", err))
				return
			}
			size = len(b)
			for _, c := range b {
				sum = sum*31 + uint64(c)
			}
		case "model", "stream":
			b, _ := io.ReadAll(io.LimitReader(p, 1024))
			if p.FormName() == "model" {
				model = string(b)
			} else {
				stream = string(b)
			}
		}
	}
	m, e := s.model(model)
	if e != nil {
		writeError(w, e)
		return
	}
	if size < 0 {
		writeError(w, badRequest("file", "file is required"))
		return
	}
	text := fmt.Sprintf("%d bytes of audio, checksum %x", size, sum)
	s.served[m].Add(1)
	if stream != "true" {
		writeJSON(w, http.StatusOK, map[string]any{"text": text, "usage": map[string]any{"type": "duration", "seconds": size / 32000}})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	id := "trsc-" + s.reqID()
	for _, word := range strings.SplitAfter(text, " ") {
		b, _ := json.Marshal(map[string]any{"id": id, "object": "transcription.chunk", "created": time.Now().Unix(), "model": m,
			"choices": []any{map[string]any{"delta": map[string]any{"content": word}, "finish_reason": nil, "stop_reason": nil}}})
		fmt.Fprintf(w, "data: %s\n\n", b)
		rc.Flush()
	}
	io.WriteString(w, "data: [DONE]\n\n")
	rc.Flush()
}

// reqID is a short unique id for non-generation answers.
func (s *Server) reqID() string {
	s.mu.Lock()
	s.nextID++
	id := s.nextID
	s.mu.Unlock()
	return strconv.FormatUint(id, 16)
}
