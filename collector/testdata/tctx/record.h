/* OTEP 4947's thread-local context record: packed, native byte order. */
#include <stdint.h>

struct tctx_record {
	uint8_t trace_id[16];
	uint8_t span_id[8];
	uint8_t valid;
	uint8_t trace_flags;
	uint16_t attrs_size;
	uint8_t attrs[612];
} __attribute__((packed, aligned(8)));
