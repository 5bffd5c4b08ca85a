/* uclass: the character classes the pre-tokenizer's patterns name, one per code point.
 *
 * tiktoken's patterns ask of a character whether it is \p{L} (split into Lu/Lt, Ll and
 * Lm/Lo, as o200k_base's pattern does), \p{M}, \p{N}, \s (Unicode White_Space), or \r / \n.
 * Each code point has exactly one of the classes below; the sets the patterns use are unions
 * of them (the MG_UC_SET_* masks: test with mg_uclass_in). The table is generated from the
 * Unicode version of the npm tiktoken package's regex engine (scripts/gen-uclass.mjs). */
#ifndef MG_UCLASS_H
#define MG_UCLASS_H

#include <stdint.h>

typedef enum {
    MG_UC_OTHER = 0, /* none of the below: punctuation, symbols, controls, unassigned */
    MG_UC_LU = 1,    /* Lu, Lt: upper- and titlecase letters */
    MG_UC_LL = 2,    /* Ll: lowercase letters */
    MG_UC_LMO = 3,   /* Lm, Lo: modifier and other letters (CJK, kana, Hangul, Arabic, ...) */
    MG_UC_M = 4,     /* Mn, Mc, Me: marks */
    MG_UC_N = 5,     /* Nd, Nl, No: numbers */
    MG_UC_WS = 6,    /* White_Space other than \r and \n */
    MG_UC_CRLF = 7,  /* \r and \n */
} mg_uclass_t;

#define MG_UC_BIT(c) (1u << (c))
/* \p{L} */
#define MG_UC_SET_L (MG_UC_BIT(MG_UC_LU) | MG_UC_BIT(MG_UC_LL) | MG_UC_BIT(MG_UC_LMO))
/* \s */
#define MG_UC_SET_WS (MG_UC_BIT(MG_UC_WS) | MG_UC_BIT(MG_UC_CRLF))
/* [^\r\n\p{L}\p{N}]: the optional character before a word */
#define MG_UC_SET_PRE (MG_UC_BIT(MG_UC_OTHER) | MG_UC_BIT(MG_UC_M) | MG_UC_BIT(MG_UC_WS))
/* [^\s\p{L}\p{N}]: punctuation and symbols (marks included) */
#define MG_UC_SET_PUNCT (MG_UC_BIT(MG_UC_OTHER) | MG_UC_BIT(MG_UC_M))
/* o200k_base's [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]: the head of a word */
#define MG_UC_SET_UPPER (MG_UC_BIT(MG_UC_LU) | MG_UC_BIT(MG_UC_LMO) | MG_UC_BIT(MG_UC_M))
/* o200k_base's [\p{Ll}\p{Lm}\p{Lo}\p{M}]: the tail of a word */
#define MG_UC_SET_LOWER (MG_UC_BIT(MG_UC_LL) | MG_UC_BIT(MG_UC_LMO) | MG_UC_BIT(MG_UC_M))

extern const uint16_t mg_uclass_stage1[0x110000 >> 7];
extern const uint8_t mg_uclass_stage2[];
extern const uint8_t mg_uclass_ascii[128];

/* The class of code point cp (0 <= cp <= 0x10FFFF; surrogates are MG_UC_OTHER). */
static inline mg_uclass_t mg_uclass(uint32_t cp)
{
    if (cp < 128) return (mg_uclass_t)mg_uclass_ascii[cp];
    return (mg_uclass_t)mg_uclass_stage2[(uint32_t)mg_uclass_stage1[cp >> 7] * 128u + (cp & 127u)];
}

/* 1 when class c belongs to the set (an MG_UC_SET_* mask). */
static inline int mg_uclass_in(mg_uclass_t c, unsigned set)
{
    return (int)((set >> c) & 1u);
}

/* The Unicode version the table was generated from ("15.0.0"). */
const char *mg_uclass_unicode_version(void);

#endif
