// like ggml's backend registry: its compile line carries every enabled backend's GGML_USE_<NAME>
int probe_backend_count() {
    int n = 0;
#ifdef GGML_USE_CPU
    n++;
#endif
#ifdef GGML_USE_RPC
    n++;
#endif
    return n;
}
