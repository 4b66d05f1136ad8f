package envelope_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
)

// deliveryOf turns a publishing into the delivery a consumer would see.
func deliveryOf(p amqp.Publishing) amqp.Delivery {
	return amqp.Delivery{
		Headers:         p.Headers,
		ContentType:     p.ContentType,
		ContentEncoding: p.ContentEncoding,
		DeliveryMode:    p.DeliveryMode,
		CorrelationId:   p.CorrelationId,
		MessageId:       p.MessageId,
		Timestamp:       p.Timestamp.Truncate(time.Second), // AMQP carries seconds
		Type:            p.Type,
		UserId:          p.UserId,
		Body:            p.Body,
	}
}

func TestToPublishing(t *testing.T) {
	for _, typ := range envelope.Types() {
		t.Run(string(typ), func(t *testing.T) {
			e := validEnvelope(typ)
			e.Timestamp = e.Timestamp.Add(123 * time.Millisecond)
			body, err := envelope.Encode(e)
			if err != nil {
				t.Fatal(err)
			}
			p := envelope.ToPublishing(e, body, "caller.alpha@/hcp")
			wantCorr := ""
			if typ != envelope.TypeTaskSubmit {
				wantCorr = sessID
			}
			checks := []struct {
				prop      string
				got, want any
			}{
				{"message_id", p.MessageId, msgID},
				{"timestamp", p.Timestamp, e.Timestamp},
				{"correlation_id", p.CorrelationId, wantCorr},
				{"content_type", p.ContentType, "application/json"},
				{"content_encoding", p.ContentEncoding, "utf-8"},
				{"delivery_mode", p.DeliveryMode, uint8(2)},
				{"type", p.Type, string(typ)},
				{"user_id", p.UserId, "caller.alpha@/hcp"},
				{"body", string(p.Body), string(body)},
			}
			for _, c := range checks {
				if c.got != c.want {
					t.Errorf("%s = %v, want %v", c.prop, c.got, c.want)
				}
			}
			if p.Timestamp.Location() != time.UTC {
				t.Errorf("timestamp not in UTC: %v", p.Timestamp)
			}

			p2, err := envelope.EncodePublishing(e, "caller.alpha@/hcp")
			if err != nil || string(p2.Body) != string(body) || p2.MessageId != msgID {
				t.Errorf("EncodePublishing: %v %+v", err, p2)
			}

			d := deliveryOf(p)
			got, err := envelope.FromDelivery(d, 0)
			if err != nil {
				t.Fatalf("FromDelivery: %v", err)
			}
			if !got.Equal(e) {
				t.Errorf("FromDelivery = %+v, want %+v", got, e)
			}
			if id := envelope.Identity(d); id != "caller.alpha@/hcp" {
				t.Errorf("Identity = %q", id)
			}
		})
	}
	if _, err := envelope.EncodePublishing(&envelope.Envelope{}, "x"); err == nil {
		t.Error("EncodePublishing accepted an invalid envelope")
	}
}

func TestFromDelivery(t *testing.T) {
	sub := validEnvelope(envelope.TypeTaskSubmit)
	ev := validEnvelope(envelope.TypeEvent)
	subBody, _ := envelope.Encode(sub)
	evBody, _ := envelope.Encode(ev)
	base := func(e *envelope.Envelope, body []byte) amqp.Delivery {
		return deliveryOf(envelope.ToPublishing(e, body, "u"))
	}
	tests := []struct {
		name   string
		d      amqp.Delivery
		limit  int
		prop   string // expected PropertyError.Property; "" = success unless field/is set
		field  string // expected FieldError.Field
		target error  // expected errors.Is target
	}{
		{"submit", base(sub, subBody), 0, "", "", nil},
		{"event", base(ev, evBody), 0, "", "", nil},
		{"only content_type set", amqp.Delivery{ContentType: "application/json", Body: evBody}, 0, "", "", nil},
		{"content_type with charset", func() amqp.Delivery {
			d := base(ev, evBody)
			d.ContentType = "application/json; charset=UTF-8"
			return d
		}(), 0, "", "", nil},
		{"content_type upper case", func() amqp.Delivery {
			d := base(ev, evBody)
			d.ContentType = "Application/JSON"
			return d
		}(), 0, "", "", nil},
		{"content_encoding upper case", func() amqp.Delivery {
			d := base(ev, evBody)
			d.ContentEncoding = "UTF-8"
			return d
		}(), 0, "", "", nil},
		{"message_id property in upper case", func() amqp.Delivery {
			d := base(ev, evBody)
			d.MessageId = strings.ToUpper(d.MessageId)
			return d
		}(), 0, "", "", nil},
		{"correlation_id in upper case", func() amqp.Delivery {
			d := base(ev, evBody)
			d.CorrelationId = strings.ToUpper(d.CorrelationId)
			return d
		}(), 0, "", "", nil},

		{"content_type missing", func() amqp.Delivery {
			d := base(ev, evBody)
			d.ContentType = ""
			return d
		}(), 0, "content_type", "", nil},
		{"content_type text/plain", func() amqp.Delivery {
			d := base(ev, evBody)
			d.ContentType = "text/plain"
			return d
		}(), 0, "content_type", "", nil},
		{"content_type other charset", func() amqp.Delivery {
			d := base(ev, evBody)
			d.ContentType = "application/json; charset=iso-8859-1"
			return d
		}(), 0, "content_type", "", nil},
		{"content_type other parameter", func() amqp.Delivery {
			d := base(ev, evBody)
			d.ContentType = "application/json; v=2"
			return d
		}(), 0, "content_type", "", nil},
		{"content_type garbage", func() amqp.Delivery {
			d := base(ev, evBody)
			d.ContentType = ";;;"
			return d
		}(), 0, "content_type", "", nil},
		{"content_type json suffix", func() amqp.Delivery {
			d := base(ev, evBody)
			d.ContentType = "application/problem+json"
			return d
		}(), 0, "content_type", "", nil},
		{"content_encoding gzip", func() amqp.Delivery {
			d := base(ev, evBody)
			d.ContentEncoding = "gzip"
			return d
		}(), 0, "content_encoding", "", nil},
		{"message_id mismatch", func() amqp.Delivery {
			d := base(ev, evBody)
			d.MessageId = sessID
			return d
		}(), 0, "message_id", "", nil},
		{"type mismatch", func() amqp.Delivery {
			d := base(ev, evBody)
			d.Type = "task_completed"
			return d
		}(), 0, "type", "", nil},
		{"type differs in case", func() amqp.Delivery {
			d := base(ev, evBody)
			d.Type = "EVENT"
			return d
		}(), 0, "type", "", nil},
		{"correlation_id mismatch", func() amqp.Delivery {
			d := base(ev, evBody)
			d.CorrelationId = msgID
			return d
		}(), 0, "correlation_id", "", nil},
		{"correlation_id on task_submit", func() amqp.Delivery {
			d := base(sub, subBody)
			d.CorrelationId = sessID
			return d
		}(), 0, "correlation_id", "", nil},

		{"body too large", base(ev, evBody), len(evBody) - 1, "", "", envelope.ErrTooLarge},
		{"body not JSON", func() amqp.Delivery {
			d := base(ev, evBody)
			d.Body = []byte("hello")
			return d
		}(), 0, "", "", envelope.ErrMalformed},
		{"body field error", func() amqp.Delivery {
			d := base(ev, evBody)
			d.Body = obj(with(event, "type", q("nope")))
			return d
		}(), 0, "", "type", nil},
		{"empty body", amqp.Delivery{ContentType: "application/json"}, 0, "", "", envelope.ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := envelope.FromDelivery(tt.d, tt.limit)
			switch {
			case tt.prop != "":
				var pe *envelope.PropertyError
				if !errors.As(err, &pe) || pe.Property != tt.prop {
					t.Fatalf("got %v, want a PropertyError for %s", err, tt.prop)
				}
				if !strings.Contains(err.Error(), tt.prop) {
					t.Errorf("message %q does not name %s", err, tt.prop)
				}
			case tt.field != "":
				var fe *envelope.FieldError
				if !errors.As(err, &fe) || fe.Field != tt.field {
					t.Fatalf("got %v, want a FieldError for %s", err, tt.field)
				}
			case tt.target != nil:
				if !errors.Is(err, tt.target) {
					t.Fatalf("got %v, want %v", err, tt.target)
				}
			default:
				if err != nil || e == nil {
					t.Fatalf("FromDelivery: %v", err)
				}
			}
		})
	}
}

func TestIdentity(t *testing.T) {
	if got := envelope.Identity(amqp.Delivery{UserId: "callee.lab-cvd@/hcp"}); got != "callee.lab-cvd@/hcp" {
		t.Errorf("Identity = %q", got)
	}
	if got := envelope.Identity(amqp.Delivery{}); got != "" {
		t.Errorf("Identity of an unset user_id = %q", got)
	}
}

func TestDecoderFromDeliveryLimit(t *testing.T) {
	e := validEnvelope(envelope.TypeEvent)
	p, err := envelope.EncodePublishing(e, "u")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (envelope.Decoder{MaxBytes: 10}).FromDelivery(deliveryOf(p)); !errors.Is(err, envelope.ErrTooLarge) {
		t.Errorf("got %v, want ErrTooLarge", err)
	}
}
