/* A ggml graph callback (llama.cpp's cb_eval) that copies the F32 tensors of a few named nodes
 * into caller-owned buffers, without calling back into Python for each of the graph's nodes.
 *
 * ggml asks the callback about every node of every evaluation (ask = true: "do you want this
 * one?"), then calls it again with ask = false once a wanted node is computed. The names are
 * compared here; a wanted node's data is appended to its buffer. The caller (graph_capture.py)
 * reads `used[i]` floats of buffers[i] after an evaluation and sets used[i] back to 0.
 * The ggml functions come from the libggml-base llama.cpp loaded, passed in as pointers. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define TAP_MAX 8
#define TAP_NAME 64

typedef const char *(*name_fn)(const void *tensor);
typedef void *(*data_fn)(const void *tensor);
typedef int64_t (*count_fn)(const void *tensor);

typedef struct {
    name_fn get_name;          /* ggml_get_name */
    data_fn get_data;          /* ggml_get_data */
    count_fn nelements;        /* ggml_nelements */
    int32_t count;             /* wanted names */
    int32_t overflow;          /* set when a copy did not fit its buffer */
    int32_t bad_type;          /* set when a wanted tensor was not GGML_TYPE_F32 */
    int32_t pad;
    char names[TAP_MAX][TAP_NAME];
    float *buffers[TAP_MAX];   /* `capacity` floats each */
    int64_t capacity;
    int64_t used[TAP_MAX];     /* floats written since the caller last reset them */
} tap_state;

static int wanted(const tap_state *s, const char *name) {
    for (int i = 0; i < s->count; i++) {
        if (strcmp(s->names[i], name) == 0) return i;
    }
    return -1;
}

bool tap_callback(const void *tensor, bool ask, void *user) {
    tap_state *s = (tap_state *)user;
    int i = wanted(s, s->get_name(tensor));
    if (ask) return i >= 0;
    if (i < 0) return true;
    /* struct ggml_tensor starts with its enum ggml_type; GGML_TYPE_F32 is 0 */
    if (*(const int32_t *)tensor != 0) { s->bad_type = 1; return true; }
    int64_t n = s->nelements(tensor);
    if (s->used[i] + n > s->capacity) { s->overflow = 1; return true; }
    memcpy(s->buffers[i] + s->used[i], s->get_data(tensor), (size_t)n * sizeof(float));
    s->used[i] += n;
    return true;
}

int64_t tap_state_size(void) { return (int64_t)sizeof(tap_state); }
