package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"mesh/internal/seal"
	"mesh/state"
)

// SecretValue is the body of `mesh secret set`: the value, any bytes
// (base64 in JSON). It reaches only the local agent, over its socket: the
// agent seals it before anything leaves the node.
type SecretValue struct {
	Value []byte `json:"value"`
}

// SecretWrite is what a set or rm answers: WriteResult, and for a set
// whether the value was the one already set (nothing changed) and the
// nodes it was sealed to.
type SecretWrite struct {
	WriteResult
	Unchanged bool     `json:"unchanged,omitempty"`
	SealedTo  []string `json:"sealed_to,omitempty"`
}

func (a *API) secrets(w http.ResponseWriter, r *http.Request) {
	l, err := a.store.Secrets(r.Context(), r.URL.Query().Get("module"))
	if err != nil {
		fail(w, err)
		return
	}
	reply(w, l)
}

// setSecret seals the value to the module's nodes as this replica knows
// them, with the digest of the stored salt (the same value gives the same
// digest, and changes nothing); the FSM refuses it if the nodes changed.
func (a *API) setSecret(w http.ResponseWriter, r *http.Request) {
	ref := state.SecretRef{Module: r.PathValue("module"), Name: r.PathValue("name")}
	var body SecretValue
	if err := decode(r, &body); err != nil {
		fail(w, err)
		return
	}
	switch {
	case len(body.Value) == 0:
		fail(w, &state.RuleError{Kind: state.ErrInvalid, Msg: fmt.Sprintf("secret %s: the value is empty; give it on standard input or with --from-file", ref)})
		return
	case len(body.Value) > state.MaxSecretSize:
		fail(w, &state.RuleError{Kind: state.ErrInvalid, Msg: fmt.Sprintf("secret %s: the value is %d bytes; a secret holds at most 1 MiB (%d bytes)", ref, len(body.Value), state.MaxSecretSize)})
		return
	}
	req, t, err := a.sealSecret(r.Context(), ref, body.Value)
	if err != nil {
		fail(w, err)
		return
	}
	// A module whose changes roll out takes a new value through a rollout
	// too: the command asks for the format that does it (the FSM decides
	// from its own state whether this one does).
	if req.Rollout, err = a.store.RollsOut(r.Context(), ref.Module); err != nil {
		fail(w, err)
		return
	}
	res := SecretWrite{SealedTo: t.Nodes}
	if l, err := a.store.Secrets(r.Context(), ref.Module); err == nil {
		for _, s := range l {
			if s.Name == ref.Name && s.State == state.SecretSealed && len(req.Digest) >= len(s.Digest) && req.Digest[:len(s.Digest)] == s.Digest {
				res.Unchanged = true
			}
		}
	}
	a.secretWrite(w, r, req, res)
}

// sealSecret seals value to the nodes that may open ref as this replica
// knows them, with the digest of the stored salt (the same value gives the
// same digest, and changes nothing): the body of a secret.set.
func (a *API) sealSecret(ctx context.Context, ref state.SecretRef, value []byte) (*state.SecretSetRequest, state.SecretTarget, error) {
	t, err := a.store.SecretTarget(ctx, ref)
	if err != nil {
		return nil, t, err
	}
	salt := t.Salt
	if salt == "" {
		salt = seal.NewSalt()
	}
	digest, err := seal.ValueDigest(value, salt)
	if err != nil {
		return nil, t, err
	}
	sealed, err := seal.Seal(string(value), t.Keys)
	if err != nil {
		return nil, t, err
	}
	return &state.SecretSetRequest{SecretRef: ref, Sealed: sealed, Digest: digest, Salt: salt, Size: len(value), Recipients: t.Keys}, t, nil
}

func (a *API) removeSecret(w http.ResponseWriter, r *http.Request) {
	a.secretWrite(w, r, &state.SecretRemoveRequest{SecretRef: state.SecretRef{Module: r.PathValue("module"), Name: r.PathValue("name")}}, SecretWrite{})
}

// secretWrite is writeThen for a SecretWrite.
func (a *API) secretWrite(w http.ResponseWriter, r *http.Request, req state.Request, res SecretWrite) {
	if err := a.writeInto(r, req, &res.WriteResult); err != nil {
		fail(w, err)
		return
	}
	reply(w, res)
}

// Secrets lists the secrets of module (every module's when empty): never a value.
func (c *Client) Secrets(ctx context.Context, module string) ([]state.SecretInfo, error) {
	var l []state.SecretInfo
	return l, c.do(ctx, "GET", "/v1/secrets?module="+url.QueryEscape(module), nil, &l)
}

// SetSecret sets a module's secret (a preview on a DryRun client).
func (c *Client) SetSecret(ctx context.Context, module, name string, value []byte) (SecretWrite, error) {
	var res SecretWrite
	return res, c.do(ctx, "PUT", "/v1/secrets/"+url.PathEscape(module)+"/"+url.PathEscape(name), SecretValue{Value: value}, &res)
}

// RemoveSecret removes a module's secret (a preview on a DryRun client).
func (c *Client) RemoveSecret(ctx context.Context, module, name string) (SecretWrite, error) {
	var res SecretWrite
	return res, c.do(ctx, "DELETE", "/v1/secrets/"+url.PathEscape(module)+"/"+url.PathEscape(name), nil, &res)
}
