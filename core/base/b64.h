/* b64: the standard base64 alphabet (RFC 4648, section 4), for the decoders that read it
 * (secret tokens, the tokenizer's rank files). */
#ifndef MG_B64_H
#define MG_B64_H

/* The value (0..63) of the base64 digit c, or -1 when c is not one ('=' included). */
int mg_b64_digit(unsigned char c);

#endif
