package affinity

import (
	"github.com/valyala/fastjson"
)

// Canonical prompt of a Responses API request (/v1/responses). vLLM renders
// it through the chat template as: `instructions` as a system message, then
// the input items, so the canonical bytes follow ParseChat's format and a
// Responses request whose instructions equal a chat request's system message
// shares its leading blocks with it:
//
//	instructions (a string):            MSG with role "system"
//	input items with role system/developer, in order: MSG
//	if tools present:   0x1E "tools" 0x1F TOOL (0x1F TOOL)*
//	the other input items, in order:
//	  a message (has a string role):    MSG
//	  any other item (function_call, function_call_output, reasoning, ...):
//	                                    0x1E type 0x1F compact JSON of the item
//	input as a string:                  MSG with role "user"
//
// Message content: a string as is; an array of parts concatenated, a part
// with a string `text` (input_text, output_text, text) as its text, an
// input_image part as its image_url (or file_id), any other part as
// compact JSON.

var (
	errBadResponsesInput = &FieldError{Field: "input", Msg: "input must be a string or an array of input items"}
	errBadResponsesItem  = &FieldError{Field: "input", Msg: "input[] must be objects (messages with a string role, or items with a string type)"}
	errBadInstructions   = &FieldError{Field: "instructions", Msg: "instructions must be a string"}
	errBadPrevResponse   = &FieldError{Field: "previous_response_id", Msg: "previous_response_id must be a non-empty string"}
)

// responsesFields are the Responses-only keys the router reads; like
// routingFields, each must appear once and in lower case.
var responsesFields = [...]string{"instructions", "previous_response_id", "max_output_tokens"}

var errDupResponsesField = dupFieldErrors(responsesFields[:])

// ParseResponses parses a /v1/responses body into out (model, stream, user,
// cache_salt, max_output_tokens, the canonical prompt and its hashes) and
// returns its previous_response_id (nil when absent or null). prev aliases
// body.
func (p *Parser) ParseResponses(body []byte, out *Prompt) (prev []byte, err error) {
	v, err := p.begin(body, out)
	if err != nil {
		return nil, err
	}
	o, _ := v.Object()
	if err := checkResponsesKeys(o); err != nil {
		return nil, err
	}
	if mt := v.GetInt("max_output_tokens"); mt > 0 {
		out.MaxTokens = mt
	}
	if pr := o.Get("previous_response_id"); pr != nil && pr.Type() != fastjson.TypeNull {
		prev, err = pr.StringBytes()
		if err != nil || len(prev) == 0 {
			return nil, errBadPrevResponse
		}
	}
	if ins := o.Get("instructions"); ins != nil && ins.Type() != fastjson.TypeNull {
		s, err := ins.StringBytes()
		if err != nil {
			return nil, errBadInstructions
		}
		if len(s) > 0 {
			p.appendRecord(roleSystem, s)
		}
	}
	in := o.Get("input")
	if in == nil {
		return nil, errBadInput
	}
	var items []*fastjson.Value
	switch in.Type() {
	case fastjson.TypeString:
	case fastjson.TypeArray:
		items, _ = in.Array()
		for _, it := range items {
			if it.Type() != fastjson.TypeObject {
				return nil, errBadResponsesItem
			}
			role := it.GetStringBytes("role")
			if len(role) == 0 && len(it.GetStringBytes("type")) == 0 {
				return nil, errBadResponsesItem
			}
			if isSystem(role) {
				p.appendResponsesItem(it, role)
			}
		}
	default:
		return nil, errBadResponsesInput
	}
	if tools := v.GetArray("tools"); len(tools) > 0 {
		p.appendByte(sepRecord)
		p.appendText(toolsTag)
		for _, t := range tools {
			p.appendByte(sepUnit)
			p.appendJSON(t)
		}
	}
	if in.Type() == fastjson.TypeString {
		s, _ := in.StringBytes()
		p.appendRecord(roleUser, s)
	}
	for _, it := range items {
		if role := it.GetStringBytes("role"); !isSystem(role) {
			p.appendResponsesItem(it, role)
		}
	}
	p.finish(out)
	return prev, nil
}

var (
	roleSystem = []byte("system")
	roleUser   = []byte("user")
)

// appendRecord adds MSG = 0x1E role 0x1F text.
func (p *Parser) appendRecord(role, text []byte) {
	p.appendByte(sepRecord)
	p.appendText(role)
	p.appendByte(sepUnit)
	p.appendText(text)
}

// appendResponsesItem adds one input item: a message as MSG, anything else
// as its type and compact JSON.
func (p *Parser) appendResponsesItem(it *fastjson.Value, role []byte) {
	if len(role) == 0 {
		p.appendByte(sepRecord)
		p.appendText(it.GetStringBytes("type"))
		p.appendByte(sepUnit)
		p.appendJSON(it)
		return
	}
	p.appendByte(sepRecord)
	p.appendText(role)
	p.appendByte(sepUnit)
	p.appendContent(it.Get("content"), true)
}

func (p *Parser) appendResponsesPart(part *fastjson.Value) {
	if t := part.Get("text"); t != nil && t.Type() == fastjson.TypeString {
		s, _ := t.StringBytes()
		p.appendText(s)
		return
	}
	if string(part.GetStringBytes("type")) == "input_image" {
		if u := part.GetStringBytes("image_url"); u != nil {
			p.appendText(u)
			return
		}
		if u := part.GetStringBytes("file_id"); u != nil {
			p.appendText(u)
			return
		}
	}
	p.appendJSON(part)
}

// checkResponsesKeys is checkKeys for responsesFields.
func checkResponsesKeys(o *fastjson.Object) error {
	return checkFieldSet(o, responsesFields[:], errDupResponsesField, len("instructions"), 3*len("previous_response_id"))
}
