package workload

import (
	"fmt"
	"math/rand/v2"
)

// SharedPrefixConfig is the SGLang "generated shared prefix" shape: Groups
// system prompts, each followed by PromptsPerGroup different questions.
type SharedPrefixConfig struct {
	Groups          int     // default 64
	PromptsPerGroup int     // default 16
	SystemTokens    int     // default 2048
	QuestionTokens  int     // default 128
	OutputTokens    int     // default 256
	RPS             float64 // Poisson arrival rate; default 8
	Model           string  // default "demo-llama-8b"
	Seed            uint64
	SharedSeed      uint64 // seed of the prompts requests share (system prompts, instructions, documents); 0: Seed
}

// DefaultSharedPrefix returns the SGLang bench defaults: 64 groups x 16
// prompts, 2048-token system prompt, 128-token question, 256 output tokens.
func DefaultSharedPrefix() SharedPrefixConfig {
	return SharedPrefixConfig{Groups: 64, PromptsPerGroup: 16, SystemTokens: 2048, QuestionTokens: 128, OutputTokens: 256, RPS: 8, Model: DefaultModel}
}

// B2BSaaS is the shared-prefix shape of a business SaaS: 150 groups (one per
// customer company) x 5 users, a 6000-token company document prefix, a
// 1200-token question, 1000 output tokens.
func B2BSaaS() SharedPrefixConfig {
	return SharedPrefixConfig{Groups: 150, PromptsPerGroup: 5, SystemTokens: 6000, QuestionTokens: 1200, OutputTokens: 1000, RPS: 2, Model: DefaultModel}
}

// DefaultModel is the model name the generators use unless told otherwise.
const DefaultModel = "demo-llama-8b"

// SharedPrefix generates the shuffled shared-prefix workload.
func SharedPrefix(c SharedPrefixConfig) (*Workload, error) {
	if c.Groups <= 0 || c.PromptsPerGroup <= 0 || c.SystemTokens < 0 || c.QuestionTokens <= 0 || c.OutputTokens <= 0 || c.RPS <= 0 {
		return nil, fmt.Errorf("shared-prefix: groups, prompts_per_group, question_tokens, output_tokens and rps must be > 0 (got %+v)", c)
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x5a5a))
	n := c.Groups * c.PromptsPerGroup
	w := &Workload{Name: "shared-prefix", Params: params("groups", c.Groups, "prompts_per_group", c.PromptsPerGroup,
		"system_tokens", c.SystemTokens, "question_tokens", c.QuestionTokens, "output_tokens", c.OutputTokens, "rps", c.RPS, "seed", c.Seed)}
	w.Requests = make([]Request, 0, n)
	for g := 0; g < c.Groups; g++ {
		for p := 0; p < c.PromptsPerGroup; p++ {
			w.Requests = append(w.Requests, Request{
				Model: c.Model,
				Messages: []Message{
					{Role: System, Segments: []Segment{{ID: segID("sp-sys", sharedSeed(c.Seed, c.SharedSeed), g, 0), Tokens: c.SystemTokens}}},
					{Role: User, Segments: []Segment{{ID: segID("sp-q", c.Seed, g, p), Tokens: c.QuestionTokens}}},
				},
				OutputTokens: c.OutputTokens, Group: g, Conversation: -1,
				Client: g, // one client per group: the group's application
			})
		}
	}
	rng.Shuffle(len(w.Requests), func(i, j int) { w.Requests[i], w.Requests[j] = w.Requests[j], w.Requests[i] })
	for i, t := range poisson(rng, n, c.RPS) {
		w.Requests[i].Arrival = t
	}
	w.sortByArrival()
	return w, nil
}

// MultiTurnConfig describes chat conversations that grow turn by turn.
type MultiTurnConfig struct {
	Conversations   int     // default 200
	MinTurns        int     // default 12
	MaxTurns        int     // default 18
	SharedTokens    int     // prefix shared by all conversations (system prompt); default 1024
	QuestionTokens  int     // each user turn; default 96
	AnswerTokens    int     // each assistant turn (also the request's output length); default 160
	ThinkSeconds    float64 // mean think time between turns (exponential); default 8
	ConversationRPS float64 // Poisson arrival rate of new conversations; default 1
	Model           string
	Seed            uint64
	SharedSeed      uint64 // seed of the prompts requests share (system prompts, instructions, documents); 0: Seed
}

// DefaultMultiTurn returns the documented multi-turn defaults.
func DefaultMultiTurn() MultiTurnConfig {
	return MultiTurnConfig{Conversations: 200, MinTurns: 12, MaxTurns: 18, SharedTokens: 1024, QuestionTokens: 96,
		AnswerTokens: 160, ThinkSeconds: 8, ConversationRPS: 1, Model: DefaultModel}
}

// MultiTurn generates conversations: turn k's prompt is the shared system
// prompt, then every earlier question and answer, then question k.
func MultiTurn(c MultiTurnConfig) (*Workload, error) {
	if c.Conversations <= 0 || c.MinTurns <= 0 || c.MaxTurns < c.MinTurns || c.QuestionTokens <= 0 || c.AnswerTokens <= 0 || c.ConversationRPS <= 0 || c.ThinkSeconds < 0 {
		return nil, fmt.Errorf("multi-turn: need conversations, min_turns, question_tokens, answer_tokens, conversation_rps > 0 and max_turns >= min_turns (got %+v)", c)
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x7e7e))
	w := &Workload{Name: "multi-turn", Params: params("conversations", c.Conversations, "turns", fmt.Sprintf("%d-%d", c.MinTurns, c.MaxTurns),
		"shared_tokens", c.SharedTokens, "question_tokens", c.QuestionTokens, "answer_tokens", c.AnswerTokens,
		"think_s", c.ThinkSeconds, "conversation_rps", c.ConversationRPS, "seed", c.Seed)}
	starts := poisson(rng, c.Conversations, c.ConversationRPS)
	sys := Segment{ID: segID("mt-sys", sharedSeed(c.Seed, c.SharedSeed), 0, 0), Tokens: c.SharedTokens}
	for conv := 0; conv < c.Conversations; conv++ {
		turns := c.MinTurns + rng.IntN(c.MaxTurns-c.MinTurns+1)
		t := starts[conv]
		var history []Message
		if c.SharedTokens > 0 {
			history = append(history, Message{Role: System, Segments: []Segment{sys}})
		}
		for k := 0; k < turns; k++ {
			q := Message{Role: User, Segments: []Segment{{ID: segID("mt-q", c.Seed, conv, k), Tokens: c.QuestionTokens}}}
			msgs := make([]Message, len(history)+1)
			copy(msgs, history)
			msgs[len(history)] = q
			w.Requests = append(w.Requests, Request{Arrival: t, Model: c.Model, Messages: msgs, OutputTokens: c.AnswerTokens,
				Group: -1, Conversation: conv, Turn: k, Client: conv})
			history = append(msgs, Message{Role: Assistant, Segments: []Segment{{ID: segID("mt-a", c.Seed, conv, k), Tokens: c.AnswerTokens}}})
			t += int64(rng.ExpFloat64() * c.ThinkSeconds * 1e9)
		}
	}
	w.sortByArrival()
	return w, nil
}

// NoSharingConfig: every prompt unique, the do-no-harm check.
type NoSharingConfig struct {
	Requests     int     // default 1000
	MinTokens    int     // default 256
	MaxTokens    int     // default 4096
	OutputTokens int     // default 256
	RPS          float64 // default 8
	Model        string
	Seed         uint64
}

// DefaultNoSharing returns the documented defaults.
func DefaultNoSharing() NoSharingConfig {
	return NoSharingConfig{Requests: 1000, MinTokens: 256, MaxTokens: 4096, OutputTokens: 256, RPS: 8, Model: DefaultModel}
}

// NoSharing generates requests whose prompts share nothing.
func NoSharing(c NoSharingConfig) (*Workload, error) {
	if c.Requests <= 0 || c.MinTokens <= 0 || c.MaxTokens < c.MinTokens || c.OutputTokens <= 0 || c.RPS <= 0 {
		return nil, fmt.Errorf("no-sharing: need requests, min_tokens, output_tokens, rps > 0 and max_tokens >= min_tokens (got %+v)", c)
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x0101))
	w := &Workload{Name: "no-sharing", Params: params("requests", c.Requests, "tokens", fmt.Sprintf("%d-%d", c.MinTokens, c.MaxTokens),
		"output_tokens", c.OutputTokens, "rps", c.RPS, "seed", c.Seed)}
	arr := poisson(rng, c.Requests, c.RPS)
	w.Requests = make([]Request, c.Requests)
	for i := range w.Requests {
		n := c.MinTokens + rng.IntN(c.MaxTokens-c.MinTokens+1)
		w.Requests[i] = Request{Arrival: arr[i], Model: c.Model, OutputTokens: c.OutputTokens, Group: -1, Conversation: -1, Client: i,
			Messages: []Message{{Role: User, Segments: []Segment{{ID: segID("ns", c.Seed, i, 0), Tokens: n}}}}}
	}
	w.sortByArrival()
	return w, nil
}

// MixedConfig: two models, long-document and short-chat traffic, with bursts.
type MixedConfig struct {
	Requests     int // default 1000
	Models       [2]string
	LongShare    float64 // fraction of long-document requests; default 0.3
	BurstEvery   float64 // seconds between bursts; default 20
	BurstLen     float64 // burst length in seconds; default 3
	BurstFactor  float64 // rate multiplier inside a burst; default 5
	RPS          float64 // base rate; default 6
	Seed         uint64
	SharedSeed   uint64 // seed of the prompts requests share (system prompts, instructions, documents); 0: Seed
	LongTokens   int    // shared document size; default 8000
	ShortTokens  int    // default 200
	OutputTokens int    // default 200
}

// DefaultMixed returns the documented defaults.
func DefaultMixed() MixedConfig {
	return MixedConfig{Requests: 1000, Models: [2]string{DefaultModel, "demo-qwen-7b"}, LongShare: 0.3, BurstEvery: 20, BurstLen: 3,
		BurstFactor: 5, RPS: 6, LongTokens: 8000, ShortTokens: 200, OutputTokens: 200}
}

// Mixed generates the mixed workload: per model, a handful of long shared
// documents with short questions, and short chats sharing one system prompt.
func Mixed(c MixedConfig) (*Workload, error) {
	if c.Requests <= 0 || c.RPS <= 0 || c.LongShare < 0 || c.LongShare > 1 || c.BurstFactor < 1 || c.LongTokens <= 0 || c.ShortTokens <= 0 || c.OutputTokens <= 0 {
		return nil, fmt.Errorf("mixed: need requests, rps, long_tokens, short_tokens, output_tokens > 0, long_share in [0,1], burst_factor >= 1 (got %+v)", c)
	}
	for i, m := range c.Models {
		if m == "" {
			return nil, fmt.Errorf("mixed: models[%d] is empty", i)
		}
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x3c3c))
	w := &Workload{Name: "mixed", Params: params("requests", c.Requests, "models", c.Models[0]+","+c.Models[1], "long_share", c.LongShare,
		"burst", fmt.Sprintf("%gx for %gs every %gs", c.BurstFactor, c.BurstLen, c.BurstEvery), "rps", c.RPS, "seed", c.Seed)}
	w.Requests = make([]Request, c.Requests)
	t := 0.0
	for i := range w.Requests {
		rate := c.RPS
		if c.BurstEvery > 0 && mod(t, c.BurstEvery) < c.BurstLen {
			rate *= c.BurstFactor
		}
		t += rng.ExpFloat64() / rate
		m := rng.IntN(2)
		r := Request{Arrival: int64(t * 1e9), Model: c.Models[m], OutputTokens: c.OutputTokens, Conversation: -1}
		if rng.Float64() < c.LongShare {
			doc := rng.IntN(8)
			r.Group = m*100 + doc
			r.Client = 1000 + r.Group
			r.Messages = []Message{
				{Role: System, Segments: []Segment{{ID: segID("mx-doc", sharedSeed(c.Seed, c.SharedSeed), m, doc), Tokens: c.LongTokens}}},
				{Role: User, Segments: []Segment{{ID: segID("mx-lq", c.Seed, i, 0), Tokens: 100}}},
			}
		} else {
			r.Group = m*100 + 99
			r.Client = i
			r.Messages = []Message{
				{Role: System, Segments: []Segment{{ID: segID("mx-sys", sharedSeed(c.Seed, c.SharedSeed), m, 0), Tokens: 300}}},
				{Role: User, Segments: []Segment{{ID: segID("mx-sq", c.Seed, i, 0), Tokens: c.ShortTokens}}},
			}
		}
		w.Requests[i] = r
	}
	w.sortByArrival()
	return w, nil
}

func mod(a, b float64) float64 { return a - b*float64(int64(a/b)) }

// OneCompanyConfig: one company's assistant. Every request carries the same
// long instruction prompt (the company's system prompt: policies, product
// docs, tools) and one user's short question; users arrive in bursts (a
// team starting its day, a shared link), not evenly. The whole fleet shares
// a single prefix: a router has to keep it warm on every replica that takes
// traffic, without piling a burst onto the one replica that had it first.
type OneCompanyConfig struct {
	Requests          int     // default 1024
	Users             int     // distinct users (clients); default 256
	InstructionTokens int     // the shared instruction prompt; default 4096
	MinQuestion       int     // question tokens, uniform in [MinQuestion, MaxQuestion]; default 32
	MaxQuestion       int     // default 64
	OutputTokens      int     // default 128
	BurstSize         int     // requests per burst; default 16
	BurstWindow       float64 // seconds a burst's arrivals spread over (uniform); default 0.5
	RPS               float64 // mean rate: bursts start as a Poisson process of rate RPS/BurstSize; default 8
	Model             string
	Seed              uint64
	SharedSeed        uint64 // seed of the prompts requests share (system prompts, instructions, documents); 0: Seed
}

// DefaultOneCompany returns the documented defaults.
func DefaultOneCompany() OneCompanyConfig {
	return OneCompanyConfig{Requests: 1024, Users: 256, InstructionTokens: 4096, MinQuestion: 32, MaxQuestion: 64,
		OutputTokens: 128, BurstSize: 16, BurstWindow: 0.5, RPS: 8, Model: DefaultModel}
}

// OneCompany generates the one-company workload: every prompt is the
// shared instruction segment then a question no other request asks; the
// asking user is drawn uniformly from Users. Group is 0 for every request
// (one prefix group), Client the user.
func OneCompany(c OneCompanyConfig) (*Workload, error) {
	if c.Requests <= 0 || c.Users <= 0 || c.InstructionTokens <= 0 || c.MinQuestion <= 0 || c.MaxQuestion < c.MinQuestion ||
		c.OutputTokens <= 0 || c.BurstSize <= 0 || c.BurstWindow < 0 || c.RPS <= 0 {
		return nil, fmt.Errorf("one-company: need requests, users, instruction_tokens, min_question, output_tokens, burst_size, rps > 0, burst_window >= 0 and max_question >= min_question (got %+v)", c)
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x0c0c))
	w := &Workload{Name: "one-company", Params: params("requests", c.Requests, "users", c.Users, "instruction_tokens", c.InstructionTokens,
		"question_tokens", fmt.Sprintf("%d-%d", c.MinQuestion, c.MaxQuestion), "output_tokens", c.OutputTokens,
		"burst", fmt.Sprintf("%dx%gs", c.BurstSize, c.BurstWindow), "rps", c.RPS, "seed", c.Seed)}
	instr := Segment{ID: segID("oc-instr", sharedSeed(c.Seed, c.SharedSeed), 0, 0), Tokens: c.InstructionTokens}
	bursts := poisson(rng, (c.Requests+c.BurstSize-1)/c.BurstSize, c.RPS/float64(c.BurstSize))
	w.Requests = make([]Request, c.Requests)
	for i := range w.Requests {
		at := bursts[i/c.BurstSize] + int64(rng.Float64()*c.BurstWindow*1e9)
		q := c.MinQuestion + rng.IntN(c.MaxQuestion-c.MinQuestion+1)
		w.Requests[i] = Request{Arrival: at, Model: c.Model, OutputTokens: c.OutputTokens, Group: 0, Conversation: -1,
			Client: rng.IntN(c.Users),
			Messages: []Message{
				{Role: System, Segments: []Segment{instr}},
				{Role: User, Segments: []Segment{{ID: segID("oc-q", c.Seed, i, 0), Tokens: q}}},
			}}
	}
	w.sortByArrival()
	return w, nil
}

// GatewayConfig shapes the gateway workload: an API gateway (or a NAT, or
// a corporate proxy) that fronts many users behind one source address,
// beside clients that connect directly. Each user belongs to one tenant,
// and a tenant's requests share its system prompt; the gateway's users
// span many tenants, so its traffic, though from one address, has many
// different prefixes. A router that keys affinity on the address (the fast
// path's promotion rule, sticky sessions) must not pin it to one replica.
type GatewayConfig struct {
	Requests       int     // default 1024
	Tenants        int     // distinct system prompts; default 32
	Users          int     // default 256; users spread round-robin over tenants
	GatewayShare   float64 // fraction of users behind the gateway (client 0); default 0.75
	SystemTokens   int     // a tenant's system prompt; default 2048
	QuestionTokens int     // default 128
	OutputTokens   int     // default 128
	RPS            float64 // Poisson; default 8
	Model          string
	Seed           uint64
	SharedSeed     uint64 // seed of the prompts requests share (system prompts, instructions, documents); 0: Seed
}

// DefaultGateway returns the documented defaults.
func DefaultGateway() GatewayConfig {
	return GatewayConfig{Requests: 1024, Tenants: 32, Users: 256, GatewayShare: 0.75, SystemTokens: 2048, QuestionTokens: 128,
		OutputTokens: 128, RPS: 8, Model: DefaultModel}
}

// Gateway generates the gateway workload: each request is a uniformly
// drawn user's, its prompt that user's tenant's system prompt then a
// question of its own. Users [0, GatewayShare×Users) send through the
// gateway (Client 0); the others directly (Client 1+user). Group is the
// tenant.
func Gateway(c GatewayConfig) (*Workload, error) {
	if c.Requests <= 0 || c.Tenants <= 0 || c.Users <= 0 || c.SystemTokens < 0 || c.QuestionTokens <= 0 || c.OutputTokens <= 0 ||
		c.RPS <= 0 || !(c.GatewayShare >= 0 && c.GatewayShare <= 1) {
		return nil, fmt.Errorf("gateway: need requests, tenants, users, question_tokens, output_tokens, rps > 0, system_tokens >= 0 and gateway_share in [0, 1] (got %+v)", c)
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x9a7e))
	w := &Workload{Name: "gateway", Params: params("requests", c.Requests, "tenants", c.Tenants, "users", c.Users,
		"gateway_share", c.GatewayShare, "system_tokens", c.SystemTokens, "question_tokens", c.QuestionTokens,
		"output_tokens", c.OutputTokens, "rps", c.RPS, "seed", c.Seed)}
	behind := int(c.GatewayShare * float64(c.Users))
	arr := poisson(rng, c.Requests, c.RPS)
	w.Requests = make([]Request, c.Requests)
	for i := range w.Requests {
		u := rng.IntN(c.Users)
		tenant := u % c.Tenants
		client := 1 + u
		if u < behind {
			client = 0
		}
		var msgs []Message
		if c.SystemTokens > 0 {
			msgs = append(msgs, Message{Role: System, Segments: []Segment{{ID: segID("gw-sys", sharedSeed(c.Seed, c.SharedSeed), tenant, 0), Tokens: c.SystemTokens}}})
		}
		msgs = append(msgs, Message{Role: User, Segments: []Segment{{ID: segID("gw-q", c.Seed, i, 0), Tokens: c.QuestionTokens}}})
		w.Requests[i] = Request{Arrival: arr[i], Model: c.Model, OutputTokens: c.OutputTokens, Group: tenant, Conversation: -1,
			Client: client, Messages: msgs}
	}
	w.sortByArrival()
	return w, nil
}

// sharedSeed is the seed of a workload's shared prompts: shared when set,
// else the workload's seed. Two draws of a workload with different seeds
// and one shared seed carry the same shared prompts and different
// questions, conversations and arrivals (the live bench's warm-up: a
// running deployment's caches hold its system prompts).
func sharedSeed(seed, shared uint64) uint64 {
	if shared != 0 {
		return shared
	}
	return seed
}
