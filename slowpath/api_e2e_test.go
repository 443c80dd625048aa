package slowpath_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/warmpath/warmpath/bench/enginesim"
	"github.com/warmpath/warmpath/slowpath"
)

var apiHTTP = &http.Client{Timeout: 20e9}

func apiDo(t *testing.T, method, url, ct, body string, hdr ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := apiHTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func respParams(input, prev string) responses.ResponseNewParams {
	p := responses.ResponseNewParams{Model: e2eModel, MaxOutputTokens: openai.Int(6),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(input)}}
	if prev == "" {
		p.Instructions = openai.String(longSystem(40))
	} else {
		p.PreviousResponseID = openai.String(prev)
	}
	return p
}

// TestAPIResponsesPinned: the Responses API through warmpath with the
// official client, streamed and not; every previous_response_id turn lands
// on the replica that stored the previous response (enginesim, as vLLM,
// answers 404 for an id it does not hold, so a misrouted turn fails), and
// the engine's cached tokens come back to the router from both shapes.
// Round-robin routing: without the pin each turn would go to another
// replica.
func TestAPIResponsesPinned(t *testing.T) {
	engines := startEngines(t, 3, nil)
	_, c, obs, _ := startAPI(t, engines, func(c *slowpath.Config) { c.Routing.Policy = "round-robin" })
	r, err := c.Responses.New(ctxT(t), respParams("first question", ""))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(r.ID, "resp_") || r.OutputText() == "" || r.Usage.InputTokens == 0 {
		t.Fatalf("response %+v", r)
	}
	prev := r.ID
	for i := range 6 {
		if i%2 == 0 {
			r, err := c.Responses.New(ctxT(t), respParams(fmt.Sprintf("follow-up %d", i), prev))
			if err != nil {
				t.Fatalf("turn %d: %v", i, err)
			}
			if r.Usage.InputTokensDetails.CachedTokens == 0 {
				t.Fatalf("turn %d: no cached tokens on the pinned replica: %+v", i, r.Usage)
			}
			prev = r.ID
			continue
		}
		st := c.Responses.NewStreaming(ctxT(t), respParams(fmt.Sprintf("streamed follow-up %d", i), prev))
		var deltas strings.Builder
		var types []string
		var done responses.Response
		for st.Next() {
			ev := st.Current()
			types = append(types, ev.Type)
			switch ev.Type {
			case "response.output_text.delta":
				deltas.WriteString(ev.Delta)
			case "response.completed":
				done = ev.Response
			}
		}
		if err := st.Err(); err != nil {
			t.Fatalf("turn %d stream: %v", i, err)
		}
		if types[0] != "response.created" || types[len(types)-1] != "response.completed" || deltas.Len() == 0 ||
			done.OutputText() != deltas.String() || done.Usage.InputTokensDetails.CachedTokens == 0 {
			t.Fatalf("turn %d stream: events %v text %q completed %+v", i, types, deltas.String(), done)
		}
		prev = done.ID
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	for i, rep := range obs.reps {
		if rep != obs.reps[0] {
			t.Fatalf("turn %d went to %s, the conversation is on %s", i, rep, obs.reps[0])
		}
		if i > 0 && obs.got[i] <= 0 {
			t.Fatalf("turn %d: router read cached tokens %d", i, obs.got[i])
		}
	}
	if len(obs.reps) != 7 {
		t.Fatalf("%d routed, want 7", len(obs.reps))
	}
}

// TestAPIResponsesErrors: the pinning failures and the Responses errors a
// client sees, each in the OpenAI error shape.
func TestAPIResponsesErrors(t *testing.T) {
	engines := startEngines(t, 2, func(c *enginesim.Config) { c.EnableAdmin = true })
	s, c, _, base := startAPI(t, engines, nil)
	r, err := c.Responses.New(ctxT(t), respParams("q", ""))
	if err != nil {
		t.Fatal(err)
	}
	// GET /v1/responses/{id} goes to the holder; an unknown id is a 404.
	st, _, body := apiDo(t, "GET", base+"/v1/responses/"+r.ID, "", "")
	if st != 200 || !strings.Contains(body, `"id":"`+r.ID+`"`) {
		t.Fatalf("retrieve: %d %s", st, body)
	}
	st, _, body = apiDo(t, "GET", base+"/v1/responses/resp_nope", "", "")
	if st != 404 || body != `{"error":{"message":"Response with id 'resp_nope' not found.","type":"invalid_request_error","param":"response_id","code":"response_not_found"}}` {
		t.Fatalf("unknown retrieve: %d %s", st, body)
	}
	// An id the router does not know is routed; the engine's own 404 passes through.
	_, err = c.Responses.New(ctxT(t), respParams("q", "resp_unknown"))
	var apiErr *openai.Error
	if !asAPIError(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Param != "response_id" {
		t.Fatalf("unknown previous id: %v", err)
	}
	// Bad JSON says where.
	st, _, body = apiDo(t, "POST", base+"/v1/responses", "application/json", `{"model":"sim-llama","input":"x"} {}`)
	if st != 400 || !strings.Contains(body, "trailing data after the JSON object at line 1, column 35 (byte offset 34)") {
		t.Fatalf("trailing data: %d %s", st, body)
	}
	// The holder unhealthy: 503; removed from the pool: 404.
	holder := holderOf(t, engines, r.ID)
	holder.SetFaults(enginesim.Faults{Unhealthy: true})
	apiWait(t, "holder unhealthy", func() bool {
		for _, rs := range s.Replicas() {
			if rs.Name == holder.Addr() {
				return !rs.Healthy
			}
		}
		return false
	})
	_, err = c.Responses.New(ctxT(t), respParams("q2", r.ID))
	if !asAPIError(err, &apiErr) || apiErr.StatusCode != 503 || apiErr.Code != "replica_unavailable" || apiErr.Param != "previous_response_id" {
		t.Fatalf("holder unhealthy: %v", err)
	}
	var keep []slowpath.ReplicaConfig
	for _, en := range engines {
		if en != holder {
			keep = append(keep, slowpath.ReplicaConfig{Address: en.Addr(), Models: []string{e2eModel}})
		}
	}
	if err := s.ApplyReplicas(keep); err != nil {
		t.Fatal(err)
	}
	_, err = c.Responses.New(ctxT(t), respParams("q3", r.ID))
	if !asAPIError(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "previous_response_not_found" {
		t.Fatalf("holder removed: %v", err)
	}
	// A stream the engine breaks mid-way ends with the router's error event.
	for _, en := range engines {
		en.SetFaults(enginesim.Faults{CloseAfterChunks: 2})
	}
	p := respParams("break me", "")
	p.MaxOutputTokens = openai.Int(12)
	stream := c.Responses.NewStreaming(ctxT(t), p)
	var deltas int
	for stream.Next() {
		if stream.Current().Type == "response.output_text.delta" {
			deltas++
		}
	}
	if err := stream.Err(); err == nil || !strings.Contains(err.Error(), "upstream replica failed mid-stream") || deltas != 2 {
		t.Fatalf("broken stream: %d deltas, err %v", deltas, err)
	}
}

func holderOf(t *testing.T, engines []*enginesim.Server, id string) *enginesim.Server {
	t.Helper()
	for _, en := range engines {
		st, _, _ := apiDo(t, "GET", "http://"+en.Addr()+"/v1/responses/"+id, "", "")
		if st == 200 {
			return en
		}
	}
	t.Fatalf("no engine holds %s", id)
	return nil
}

// startAPI is startE2E that also returns the router's base URL.
func startAPI(t *testing.T, engines []*enginesim.Server, mutate func(*slowpath.Config)) (*slowpath.Server, openai.Client, *routed, string) {
	t.Helper()
	cfg := e2eConfig(engines)
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := slowpath.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	obs := &routed{}
	s.Observer = obs
	url := serve(t, s)
	c := openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))
	return s, c, obs, url
}

// apiWait polls cond (bounded: 2000 polls of 5ms) until it holds.
func apiWait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 2000 {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}
