package slowpath

import (
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// GET /v1/models lists the models the healthy replicas serve (as
// configured: the router routes only those), each with the card its
// engines give in their own /v1/models: `owned_by`, `root`, `parent` and
// `max_model_len` are kept, merged across replicas (the first replica's
// card in table order gives owned_by, root, parent and created;
// max_model_len is the smallest any replica reports, the length every
// replica can serve). Engines' lists are fetched at most every
// modelsRefresh per replica, at the time of a /v1/models request, and the
// last good list is kept when a fetch fails. A model no engine describes
// (its fetch failed, or the engine needs an API key for /v1/models) gets
// owned_by "warmpath" and null root, parent, max_model_len.
// GET /v1/models/{id} answers one card, or 404 model_not_found.

const modelsRefresh = 2 * time.Second

// modelCard is one entry of a /v1/models list (vLLM's ModelCard fields).
type modelCard struct {
	ID          string          `json:"id"`
	Object      string          `json:"object"`
	Created     int64           `json:"created"`
	OwnedBy     string          `json:"owned_by"`
	Root        *string         `json:"root"`
	Parent      *string         `json:"parent"`
	MaxModelLen *int64          `json:"max_model_len"`
	Permission  json.RawMessage `json:"permission,omitempty"`
}

type modelsCache struct {
	mu      sync.Mutex
	fetched map[string]engineModels // by replica name
}

type engineModels struct {
	at    time.Time
	cards []modelCard
}

// engineCards returns each healthy replica's engine cards (refreshed when
// older than modelsRefresh), in table order.
func (s *Server) engineCards(reps []*replica) [][]modelCard {
	c := &s.api.models
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fetched == nil {
		c.fetched = map[string]engineModels{}
	}
	now := time.Now()
	out := make([][]modelCard, len(reps))
	var wg sync.WaitGroup
	for i, r := range reps {
		if e, ok := c.fetched[r.name]; ok && now.Sub(e.at) < modelsRefresh {
			out[i] = e.cards
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = s.fetchModels(r)
		}()
	}
	wg.Wait()
	for i, r := range reps {
		if out[i] != nil {
			c.fetched[r.name] = engineModels{at: now, cards: out[i]}
		} else if e, ok := c.fetched[r.name]; ok {
			out[i] = e.cards // keep the last good list
		}
	}
	for name := range c.fetched {
		if !slices.ContainsFunc(reps, func(r *replica) bool { return r.name == name }) {
			delete(c.fetched, name)
		}
	}
	return out
}

// fetchModels GETs the engine's /v1/models; nil on any failure.
func (s *Server) fetchModels(r *replica) []modelCard {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + r.name + "/v1/models")
	req.Header.SetHost(r.name)
	if err := r.ctl.DoTimeout(req, resp, s.cfg.Health.Timeout); err != nil || resp.StatusCode() != fasthttp.StatusOK {
		return nil
	}
	var list struct {
		Data []modelCard `json:"data"`
	}
	if err := json.Unmarshal(resp.Body(), &list); err != nil || list.Data == nil {
		return nil
	}
	return list.Data
}

// modelCards merges the healthy replicas' models into cards sorted by id.
func (s *Server) modelCards() []modelCard {
	var reps []*replica
	for _, r := range *s.table.Load() {
		if r != nil && !r.removed.Load() && r.isHealthy() {
			reps = append(reps, r)
		}
	}
	fetched := s.engineCards(reps)
	merged := map[string]*modelCard{}
	var names []string
	for i, r := range reps {
		for _, m := range r.cfg.Load().Models {
			var ec *modelCard
			for j := range fetched[i] {
				if fetched[i][j].ID == m {
					ec = &fetched[i][j]
					break
				}
			}
			cur := merged[m]
			if cur == nil {
				cur = &modelCard{ID: m, Object: "model", Created: s.started.Unix(), OwnedBy: "warmpath"}
				merged[m] = cur
				names = append(names, m)
			}
			if ec == nil {
				continue
			}
			if cur.OwnedBy == "warmpath" && cur.Root == nil { // the first engine card fills the card
				cur.OwnedBy, cur.Root, cur.Parent, cur.Permission = ec.OwnedBy, ec.Root, ec.Parent, ec.Permission
				if ec.Created > 0 {
					cur.Created = ec.Created
				}
			}
			if ec.MaxModelLen != nil && (cur.MaxModelLen == nil || *ec.MaxModelLen < *cur.MaxModelLen) {
				cur.MaxModelLen = ec.MaxModelLen
			}
		}
	}
	slices.Sort(names)
	out := make([]modelCard, len(names))
	for i, n := range names {
		out[i] = *merged[n]
	}
	return out
}

// models answers GET /v1/models.
func (s *Server) models(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() {
		s.reject(ctx, apiMethod, "Method "+string(ctx.Method())+" not allowed for /v1/models; use GET", "")
		ctx.Response.Header.SetBytesKV(hdrAllow, strGET)
		return
	}
	cards := s.modelCards()
	b, _ := json.Marshal(struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{"list", cards})
	ctx.SetContentTypeBytes(strAppJSON)
	ctx.SetBody(b)
	s.m.localRequest(fasthttp.StatusOK)
}

// modelByID answers GET /v1/models/{id} (ids may contain slashes:
// "meta-llama/Llama-3.1-8B-Instruct").
func (s *Server) modelByID(ctx *fasthttp.RequestCtx, id string) {
	if !ctx.IsGet() {
		s.reject(ctx, apiMethod, "Method "+string(ctx.Method())+" not allowed for "+string(ctx.Path())+"; use GET", "")
		ctx.Response.Header.SetBytesKV(hdrAllow, strGET)
		return
	}
	for _, c := range s.modelCards() {
		if c.ID == id {
			b, _ := json.Marshal(c)
			ctx.SetContentTypeBytes(strAppJSON)
			ctx.SetBody(b)
			s.m.localRequest(fasthttp.StatusOK)
			return
		}
	}
	s.reject(ctx, apiModelNotFound, "The model `"+id+"` does not exist or you do not have access to it.", "model")
}
