package affinity

// FieldError is a request body the parser refused because of one field.
// Field is that field as an OpenAI error's `param` names it ("messages" for
// an element of messages; "" when the body as a whole is wrong); Msg says
// what it must be, naming the field as the body spells it ("messages[]
// must be objects with a string role"). It wraps ErrBadRequest; Error is
// "bad request: " followed by Msg.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return ErrBadRequest.Error() + ": " + e.Msg }

// Unwrap makes errors.Is(err, ErrBadRequest) hold.
func (e *FieldError) Unwrap() error { return ErrBadRequest }
