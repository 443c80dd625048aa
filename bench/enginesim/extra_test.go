package enginesim

import (
	"bytes"
	"encoding/json"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
)

// TestResponsesWithOpenAIClient: the Responses API as vLLM serves it, with
// the official client: one answer, a streamed turn chained by
// previous_response_id that reuses the conversation's KV blocks, retrieval,
// cancel, and an unknown previous id (vLLM's 404).
func TestResponsesWithOpenAIClient(t *testing.T) {
	s := startServer(t, nil)
	c := newClient(t, s)
	r, err := c.Responses.New(ctxT(t), responses.ResponseNewParams{Model: testModel, MaxOutputTokens: openai.Int(5),
		Instructions: openai.String(longSystem(200)), Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(r.ID, "resp_") || len(strings.Fields(r.OutputText())) != 5 || r.Usage.OutputTokens != 5 ||
		r.Status != "incomplete" || r.Usage.InputTokensDetails.CachedTokens != 0 {
		t.Fatalf("response %+v", r)
	}
	st := c.Responses.NewStreaming(ctxT(t), responses.ResponseNewParams{Model: testModel, MaxOutputTokens: openai.Int(3),
		PreviousResponseID: openai.String(r.ID), Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("more")}})
	var types []string
	var text string
	var done responses.Response
	for st.Next() {
		ev := st.Current()
		types = append(types, ev.Type)
		if ev.Type == "response.output_text.delta" {
			text += ev.Delta
		}
		if ev.Type == "response.completed" {
			done = ev.Response
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	want := "response.created response.in_progress response.output_item.added response.content_part.added " +
		"response.output_text.delta response.output_text.delta response.output_text.delta response.output_text.done " +
		"response.content_part.done response.output_item.done response.completed"
	if strings.Join(types, " ") != want {
		t.Fatalf("events %v", types)
	}
	if done.OutputText() != text || done.Usage.InputTokensDetails.CachedTokens < 200 {
		t.Fatalf("chained turn: text %q completed %+v (the first turn's blocks should be cached)", text, done.Usage)
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/responses/"+done.ID, nil))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"id":"`+done.ID+`"`) {
		t.Fatalf("retrieve: %d %s", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/responses/"+done.ID+"/cancel", nil))
	if rec.Code != 400 || !strings.Contains(rec.Body.String(), "Cannot cancel a synchronous response.") {
		t.Fatalf("cancel: %d %s", rec.Code, rec.Body)
	}
	_, err = c.Responses.New(ctxT(t), responses.ResponseNewParams{Model: testModel, PreviousResponseID: openai.String("resp_nope"),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}})
	var apiErr *openai.Error
	if !errorsAs(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Param != "response_id" || apiErr.Message != "Response with id 'resp_nope' not found." {
		t.Fatalf("unknown previous id: %v", err)
	}
}

func errorsAs(err error, target **openai.Error) bool {
	e, ok := err.(*openai.Error)
	if ok {
		*target = e
	}
	return ok
}

func audioBody(t *testing.T, file []byte, fields ...string) (*bytes.Buffer, string) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for i := 0; i+1 < len(fields); i += 2 {
		mw.WriteField(fields[i], fields[i+1])
	}
	if file != nil {
		fw, _ := mw.CreateFormFile("file", "a.wav")
		fw.Write(file)
	}
	mw.Close()
	return &b, mw.FormDataContentType()
}

// TestExtraEndpoints: vLLM's non-generation endpoints in vLLM's shapes.
func TestExtraEndpoints(t *testing.T) {
	s := startServer(t, func(c *Config) { c.MaxModelLen = 4096 })
	do := func(method, path, ct string, body *bytes.Buffer) (int, string) {
		if body == nil {
			body = &bytes.Buffer{}
		}
		req := httptest.NewRequest(method, path, body)
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	js := func(s string) *bytes.Buffer { return bytes.NewBufferString(s) }
	st, body := do("POST", "/tokenize", "application/json", js(`{"prompt":"hello world!"}`))
	var tok struct {
		Count       int
		MaxModelLen int `json:"max_model_len"`
		Tokens      []uint32
	}
	if err := json.Unmarshal([]byte(body), &tok); st != 200 || err != nil || len(tok.Tokens) != 3 || tok.Count != 3 || tok.MaxModelLen != 4096 {
		t.Fatalf("tokenize: %d %s", st, body)
	}
	ids, _ := json.Marshal(map[string]any{"model": "sql-lora", "tokens": tok.Tokens})
	if st, body := do("POST", "/detokenize", "application/json", bytes.NewBuffer(ids)); st != 200 || body != `{"prompt":"hello world!"}`+"\n" {
		t.Fatalf("detokenize: %d %s", st, body)
	}
	st, body = do("POST", "/tokenize", "application/json", js(`{"messages":[{"role":"user","content":"hi"}]}`))
	if st != 200 || !strings.Contains(body, `"count":`) {
		t.Fatalf("tokenize messages: %d %s", st, body)
	}
	file := bytes.Repeat([]byte{1, 2, 3}, 1000)
	ab, ct := audioBody(t, file, "model", testModel)
	if st, body := do("POST", "/v1/audio/transcriptions", ct, ab); st != 200 || !strings.HasPrefix(body, `{"text":"3000 bytes of audio`) {
		t.Fatalf("audio: %d %s", st, body)
	}
	ab, ct = audioBody(t, file, "stream", "true")
	if st, body := do("POST", "/v1/audio/translations", ct, ab); st != 200 || !strings.Contains(body, `"transcription.chunk"`) || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("audio stream: %d %s", st, body)
	}
	for _, tc := range []struct {
		name, method, path, ct string
		body                   *bytes.Buffer
		status                 int
		want                   string
	}{
		{"rerank", "POST", "/v2/rerank", "application/json", js(`{"model":"alias","query":"fox","documents":["dog","a fox"],"top_n":1}`), 200, `"results":[{"index":1,"document":{"text":"a fox"},"relevance_score":1}]`},
		{"score", "POST", "/score", "application/json", js(`{"text_1":["a","b"],"text_2":["a","c"]}`), 200, `"data":[{"index":0,"object":"score","score":1},{"index":1,"object":"score","score":0}]`},
		{"score length mismatch", "POST", "/v1/score", "application/json", js(`{"text_1":["a","b"],"text_2":["a","c","d"]}`), 400, `"param":"text_1"`},
		{"pooling", "POST", "/pooling", "application/json", js(`{"input":"x"}`), 200, `"index":0,"object":"pooling"}]`},
		{"unknown model", "POST", "/tokenize", "application/json", js(`{"model":"nope","prompt":"x"}`), 404, `"code":"model_not_found"`},
		{"GET tokenize", "GET", "/tokenize", "", nil, 405, `method GET not allowed`},
		{"audio without file", "POST", "/v1/audio/transcriptions", "", nil, 400, `"param":"file"`},
		{"detokenize without tokens", "POST", "/detokenize", "application/json", js(`{}`), 400, `"param":"tokens"`},
		{"responses without input", "POST", "/v1/responses", "application/json", js(`{"model":"sim-llama"}`), 400, `"param":"input"`},
		{"responses bad item", "POST", "/v1/responses", "application/json", js(`{"model":"sim-llama","input":[{"type":"function_call"}]}`), 400, `"param":"input[0].type"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "audio without file" {
				tc.body, tc.ct = audioBody(t, nil, "model", testModel)
			}
			st, body := do(tc.method, tc.path, tc.ct, tc.body)
			if st != tc.status || !strings.Contains(body, tc.want) {
				t.Fatalf("%d %s, want %d %s", st, body, tc.status, tc.want)
			}
		})
	}
}

// FuzzExtraRequest posts arbitrary bodies to the Responses API and the
// non-generation endpoints: 200 with JSON or SSE, or an OpenAI error; never
// a panic.
func FuzzExtraRequest(f *testing.F) {
	paths := []string{"/v1/responses", "/tokenize", "/detokenize", "/v1/rerank", "/v1/score", "/pooling"}
	for _, s := range []string{`{"model":"m","input":"hi","max_output_tokens":2}`, `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"a"}]}],"stream":true,"max_output_tokens":2}`,
		`{"prompt":"abc"}`, `{"tokens":[1,2,4294967295]}`, `{"query":"a","documents":["a"]}`, `{"text_1":"a","text_2":["b"]}`, `{"input":["x"]}`, `[]`, `{"previous_response_id":"x","input":"y"}`} {
		for i := range paths {
			f.Add(s, uint8(i))
		}
	}
	s := fuzzServer(f)
	f.Fuzz(func(t *testing.T, body string, p uint8) {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, paths[int(p)%len(paths)], strings.NewReader(body)))
		out := rec.Body.Bytes()
		switch {
		case rec.Code == http.StatusOK && strings.HasPrefix(rec.Header().Get("Content-Type"), "text/event-stream"):
			if !bytes.Contains(out, []byte("event: response.completed\n")) {
				t.Fatalf("stream without response.completed: %q", out)
			}
		case rec.Code == http.StatusOK:
			if !json.Valid(out) {
				t.Fatalf("200 with invalid JSON: %q", out)
			}
		default:
			var e struct {
				Error struct{ Message, Type string }
			}
			if err := json.Unmarshal(out, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
				t.Fatalf("%d without an OpenAI error: %q", rec.Code, out)
			}
		}
	})
}
