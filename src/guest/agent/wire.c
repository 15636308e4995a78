/*
 * TLV decoding and frame building. Decoding never copies: fields point into the
 * received frame, which the caller keeps alive while it looks at them.
 */
#include "agent.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TLV_HEADER_SIZE 6u

void tlv_cursor_init(struct tlv_cursor *c, const uint8_t *payload, size_t len)
{
    c->next = payload;
    c->left = len;
}

int tlv_next(struct tlv_cursor *c, struct tlv_field *f)
{
    if (c->left == 0) return 0;
    if (c->left < TLV_HEADER_SIZE) return -1;
    uint32_t len = load_le32(c->next + 2);
    if (len > c->left - TLV_HEADER_SIZE) return -1;
    f->tag = load_le16(c->next);
    f->len = len;
    f->value = c->next + TLV_HEADER_SIZE;
    c->next += TLV_HEADER_SIZE + len;
    c->left -= TLV_HEADER_SIZE + len;
    return 1;
}

bool tlv_well_formed(const uint8_t *payload, size_t len)
{
    struct tlv_cursor c;
    struct tlv_field f;
    int rc;
    tlv_cursor_init(&c, payload, len);
    while ((rc = tlv_next(&c, &f)) == 1) {
    }
    return rc == 0;
}

bool tlv_as_u8(const struct tlv_field *f, uint8_t *out)
{
    if (f->len != 1) return false;
    *out = f->value[0];
    return true;
}

bool tlv_as_u32(const struct tlv_field *f, uint32_t *out)
{
    if (f->len != 4) return false;
    *out = load_le32(f->value);
    return true;
}

bool tlv_as_u64(const struct tlv_field *f, uint64_t *out)
{
    if (f->len != 8) return false;
    *out = load_le64(f->value);
    return true;
}

bool tlv_has_nul(const struct tlv_field *f) { return f->len > 0 && memchr(f->value, 0, f->len) != NULL; }

bool tlv_copy_text(const struct tlv_field *f, char *dst, size_t cap)
{
    if (tlv_has_nul(f) || f->len >= cap) return false;
    memcpy(dst, f->value, f->len);
    dst[f->len] = '\0';
    return true;
}

bool frame_begin(struct frame_builder *b, uint16_t type, uint32_t id, size_t payload_cap)
{
    if (payload_cap > MAX_FRAME_PAYLOAD) payload_cap = MAX_FRAME_PAYLOAD;
    b->cap = FRAME_HEADER_SIZE + payload_cap;
    b->overflow = false;
    b->open_field = 0;
    b->frame = malloc(sizeof(struct out_frame) + b->cap);
    if (!b->frame) {
        agent_log("out of memory building a frame of type %#x", type);
        return false;
    }
    b->frame->next = NULL;
    b->frame->sent = 0;
    b->frame->len = FRAME_HEADER_SIZE;
    uint8_t *h = b->frame->bytes;
    store_le32(h, FRAME_MAGIC);
    store_le16(h + 4, type);
    store_le16(h + 6, 0);
    store_le32(h + 8, id);
    store_le32(h + 12, 0);
    return true;
}

static uint8_t *frame_space(struct frame_builder *b, size_t n)
{
    if (!b->frame || b->overflow) return NULL;
    if (n > b->cap - b->frame->len) {
        b->overflow = true;
        return NULL;
    }
    uint8_t *p = b->frame->bytes + b->frame->len;
    b->frame->len += n;
    return p;
}

static uint8_t *frame_field(struct frame_builder *b, uint16_t tag, size_t len)
{
    uint8_t *p = frame_space(b, TLV_HEADER_SIZE + len);
    if (!p) return NULL;
    store_le16(p, tag);
    store_le32(p + 2, (uint32_t)len);
    return p + TLV_HEADER_SIZE;
}

void frame_put_u8(struct frame_builder *b, uint16_t tag, uint8_t v)
{
    uint8_t *p = frame_field(b, tag, 1);
    if (p) p[0] = v;
}

void frame_put_u32(struct frame_builder *b, uint16_t tag, uint32_t v)
{
    uint8_t *p = frame_field(b, tag, 4);
    if (p) store_le32(p, v);
}

void frame_put_i32(struct frame_builder *b, uint16_t tag, int32_t v) { frame_put_u32(b, tag, (uint32_t)v); }

void frame_put_u64(struct frame_builder *b, uint16_t tag, uint64_t v)
{
    uint8_t *p = frame_field(b, tag, 8);
    if (p) store_le64(p, v);
}

void frame_put_bytes(struct frame_builder *b, uint16_t tag, const void *data, size_t len)
{
    uint8_t *p = frame_field(b, tag, len);
    if (p && len) memcpy(p, data, len);
}

void frame_put_text(struct frame_builder *b, uint16_t tag, const char *text) { frame_put_bytes(b, tag, text, strlen(text)); }

void frame_put_raw(struct frame_builder *b, const void *data, size_t len)
{
    uint8_t *p = frame_space(b, len);
    if (p && len) memcpy(p, data, len);
}

uint8_t *frame_open_field(struct frame_builder *b, uint16_t tag, size_t max_len)
{
    if (!b->frame) return NULL;
    size_t field_start = b->frame->len;
    uint8_t *value = frame_field(b, tag, max_len);
    if (value) b->open_field = field_start;
    return value;
}

void frame_close_field(struct frame_builder *b, size_t actual_len)
{
    if (!b->frame || b->overflow || !b->open_field) return;
    uint8_t *field = b->frame->bytes + b->open_field;
    store_le32(field + 2, (uint32_t)actual_len);
    b->frame->len = b->open_field + TLV_HEADER_SIZE + actual_len;
    b->open_field = 0;
}

void frame_send(struct frame_builder *b)
{
    struct out_frame *f = b->frame;
    b->frame = NULL;
    if (!f) return;
    if (b->overflow) {
        /* A bug in a reply builder, not a peer problem: drop rather than send a lie. */
        agent_log("frame of type %#x overflowed its %zu-byte budget; dropped", load_le16(f->bytes + 4), b->cap);
        free(f);
        return;
    }
    store_le32(f->bytes + 12, (uint32_t)(f->len - FRAME_HEADER_SIZE));
    /* Builders reserve generously (FILE_DATA reserves a whole chunk); give the slack back
       so the output queue's byte accounting reflects what is really held. */
    if (f->len + 4096 < b->cap) {
        struct out_frame *shrunk = realloc(f, sizeof(struct out_frame) + f->len);
        if (shrunk) f = shrunk;
    }
    output_enqueue(f);
}

void send_simple_frame(uint16_t type, uint32_t id, const void *raw, size_t len)
{
    struct frame_builder b;
    if (!frame_begin(&b, type, id, len)) return;
    frame_put_raw(&b, raw, len);
    frame_send(&b);
}

void reply_ok(uint32_t id) { send_simple_frame(MSG_OK, id, NULL, 0); }

void reply_error(uint32_t id, const char *code, const char *fmt, ...)
{
    char message[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    agent_log("error reply id=%u code=%s: %s", id, code, message);

    struct frame_builder b;
    if (!frame_begin(&b, MSG_ERROR, id, 2 * TLV_HEADER_SIZE + strlen(code) + strlen(message))) return;
    frame_put_text(&b, TAG_CODE, code);
    frame_put_text(&b, TAG_MESSAGE, message);
    frame_send(&b);
}
