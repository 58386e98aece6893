//! [`predict_json`]: prediction straight from `network_info` JSON text, reading only the
//! fields prediction needs (`id`, `type`, `vnic_type`, `active`, `details.ovs_hybrid_plug`)
//! with the same strict rules and [`Problem`]s as the full model in [`crate::vif`].
//!
//! ## Layout
//! - [`Scan`]: reads the levels prediction looks into (the list, each VIF dict, `details`)
//!   token by token, checking their grammar in full. A string's end is found in 64-byte
//!   windows of string stops (`"`, `\`, control bytes) classified with SSE2 and kept from
//!   one string to the next ([`Scan::string_end`]), so that going from one token to the
//!   next is a shift and a bit scan; a number, literal or string value of a key prediction
//!   does not read is checked and stepped over ([`Scan::skip_value`]).
//! - [`skip_container`]: an object or array value of a key prediction does not read
//!   (`network` with its subnets, `profile`, `meta`, ...: most of a real document's bytes)
//!   is stepped over 64 bytes at a time. Each block is classified with SSE2 (quotes,
//!   brackets, and whether it holds a rare byte: `\` or a control byte); which bytes lie
//!   inside strings follows from the quotes by a prefix XOR, and only brackets outside
//!   strings are looked at one by one, to match them. A block holding a rare byte is
//!   walked a byte at a time ([`bytewise`]).
//! - [`predict_json`]: reads the whole document, then checks each VIF's fields in list
//!   order as [`crate::vif::Vif::from_value`] does for those fields, so that a JSON error
//!   anywhere is reported before a field error, as by the full parser. Fields written
//!   plainly (strings without escapes, JSON booleans), as Nova writes them, take a short
//!   path ([`plain_fields`]); any other VIF goes through [`fields`], which builds the full
//!   parser's errors.
//!
//! ## Contract (checked by the `predict_json` fuzz target)
//! For any text [`crate::vif::NetworkInfo::parse`] accepts, the result equals parsing with it
//! and calling [`super::predict`]. Where this path refuses a text, the full path refuses it
//! too. It accepts some texts the full parser refuses, because it reads fewer fields:
//! - a bad value in a field prediction does not read (a malformed `address`, say);
//! - inside an object or array it skips, only structure is checked, as simdjson's
//!   On-Demand API checks what it skips: strings end, escapes are well formed, no control
//!   byte is inside a string, brackets balance and match in kind, and bytes below 0x20
//!   outside strings are whitespace. Commas, colons, numbers and literals inside are not
//!   checked (`{"network": {"mtu": 14x2}}` passes);
//! - a number out of `f64` range, an unpaired UTF-16 surrogate escape in a skipped string,
//!   or nesting deeper than `serde_json`'s 128 levels (this path allows 128 levels below
//!   each VIF field).
//!
//! What is stored or acted on never comes from here: the agent, `vireo events explain` and
//! every flow parse `network_info` with the full parser. A key given twice counts once, with
//! its last value, as in the full parser (`serde_json::Value`).

use std::borrow::Cow;
use std::collections::HashSet;

use serde_json::Value;

use super::{classify, table_cell, Operation, PredictError, Prediction, VifPrediction, Wiring};
use crate::vif::{PortId, Problem, VifError, VifType, VnicType};

/// A JSON scalar as prediction needs it. `null` is read as absent, as the full parser does.
#[derive(Debug, Clone, Copy)]
enum Scalar<'a> {
    Bool(bool),
    /// A string's contents as written, and whether they hold an escape (decoded only when
    /// the field is checked).
    Str(&'a str, bool),
    /// Any other JSON value (always an error for the fields read): its text, turned into a
    /// `Value` only to show it in the error as the full parser does.
    Other(&'a str),
}

/// A string's contents with escapes decoded (by serde_json, the quotes put back around them).
#[inline(always)]
fn decoded(raw: &str, escaped: bool) -> Result<Cow<'_, str>, PredictError> {
    if !escaped {
        return Ok(Cow::Borrowed(raw));
    }
    serde_json::from_str::<String>(&format!("\"{raw}\""))
        .map(Cow::Owned)
        .map_err(|e| PredictError::NetworkInfo(VifError::Json(e.to_string())))
}

impl Scalar<'_> {
    /// The value as compact JSON text, as `serde_json::Value` prints it.
    fn shown(&self) -> String {
        match *self {
            Scalar::Bool(b) => b.to_string(),
            Scalar::Str(raw, escaped) => match decoded(raw, escaped) {
                Ok(s) => Value::String(s.into_owned()).to_string(),
                Err(_) => format!("\"{raw}\""),
            },
            Scalar::Other(text) => serde_json::from_str::<Value>(text)
                .map_or_else(|_| text.to_owned(), |v| v.to_string()),
        }
    }
}

/// `details`, as far as prediction reads it.
#[derive(Debug, Default, Clone, Copy)]
enum LeanDetails<'a> {
    /// Absent or null.
    #[default]
    Absent,
    /// An object: its (last) `ovs_hybrid_plug`.
    Object(Option<Scalar<'a>>),
    /// Anything else.
    NotObject,
}

#[derive(Debug, Default, Clone, Copy)]
struct LeanVif<'a> {
    id: Option<Scalar<'a>>,
    vif_type: Option<Scalar<'a>>,
    vnic_type: Option<Scalar<'a>>,
    active: Option<Scalar<'a>>,
    details: LeanDetails<'a>,
}

impl LeanVif<'_> {
    /// The port id as given, for errors: `?` when it is missing or not a string.
    fn port_text(&self) -> Result<Cow<'_, str>, PredictError> {
        match self.id {
            Some(Scalar::Str(raw, escaped)) => decoded(raw, escaped),
            _ => Ok(Cow::Borrowed("?")),
        }
    }
}

/// A key of a VIF dict (or of its `details`): the ones prediction reads, or any other.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    Id,
    Type,
    VnicType,
    Active,
    Details,
    OvsHybridPlug,
    Other,
}

impl Key {
    #[inline(always)]
    fn of(name: &[u8]) -> Key {
        match name {
            b"id" => Key::Id,
            b"type" => Key::Type,
            b"vnic_type" => Key::VnicType,
            b"active" => Key::Active,
            b"details" => Key::Details,
            b"ovs_hybrid_plug" => Key::OvsHybridPlug,
            _ => Key::Other,
        }
    }
}

/// A grammar error: what was expected and the byte offset where it was not found.
#[derive(Debug)]
struct Syntax {
    at: usize,
    what: &'static str,
}

impl Syntax {
    /// The error as `serde_json` words its position: 1-based line and column.
    fn into_error(self, text: &str) -> PredictError {
        let before = text.as_bytes().get(..self.at).unwrap_or(text.as_bytes());
        let line = 1 + before.iter().filter(|&&c| c == b'\n').count();
        let column = 1 + before.iter().rev().take_while(|&&c| c != b'\n').count();
        PredictError::NetworkInfo(VifError::Json(format!(
            "{} at line {line} column {column}",
            self.what
        )))
    }
}

type Scanned<T> = Result<T, Syntax>;

/// Sixteen bytes at a time with SSE2, which every x86-64 processor has (`safe_arch` wraps
/// the intrinsics; no `unsafe` here).
#[cfg(target_arch = "x86_64")]
mod sse2 {
    use safe_arch::{
        bitor_m128i, cmp_eq_mask_i8_m128i, load_unaligned_m128i, m128i, max_u8_m128i, min_u8_m128i,
        move_mask_i8_m128i, set_splat_i8_m128i, zeroed_m128i,
    };

    /// Lanes equal to `c`.
    #[inline(always)]
    fn eq(v: m128i, c: u8) -> m128i {
        cmp_eq_mask_i8_m128i(v, set_splat_i8_m128i(c as i8))
    }

    /// Lanes below 0x20.
    #[inline(always)]
    fn control(v: m128i) -> m128i {
        let top = set_splat_i8_m128i(0x1f);
        cmp_eq_mask_i8_m128i(max_u8_m128i(v, top), top)
    }

    /// Lanes holding `{`, `[`, `}` or `]` (`[` and `]` are `{` and `}` without bit 5).
    #[inline(always)]
    fn bracket(v: m128i) -> m128i {
        let folded = bitor_m128i(v, set_splat_i8_m128i(0x20));
        bitor_m128i(eq(folded, b'{'), eq(folded, b'}'))
    }

    /// One bit per lane (the `i32` is never negative; `as u16` keeps all 16 bits).
    #[inline(always)]
    fn bits(v: m128i) -> u64 {
        u64::from(move_mask_i8_m128i(v) as u16)
    }

    /// Bit `n` set where byte `n` is `"`, `\\` or a control byte (below 0x20).
    #[inline(always)]
    pub(super) fn string_stops(chunk: &[u8; 16]) -> u32 {
        let v = load_unaligned_m128i(chunk);
        bits(bitor_m128i(
            bitor_m128i(eq(v, b'"'), eq(v, b'\\')),
            control(v),
        )) as u32
    }

    /// The byte classes a skipped container is walked by, sixteen bytes (tests hold
    /// [`classes64`] to these, side by side).
    #[cfg(test)]
    pub(super) fn classes(chunk: &[u8; 16]) -> super::Classes {
        let v = load_unaligned_m128i(chunk);
        super::Classes {
            quote: bits(eq(v, b'"')),
            bracket: bits(bracket(v)),
            rare: bits(bitor_m128i(eq(v, b'\\'), control(v))),
        }
    }

    /// [`super::classes64`]: the quotes and brackets of each chunk; the rare bytes of all
    /// four are gathered first (backslashes by OR, control bytes by the lowest byte), since
    /// the walk needs to know only whether the block holds one.
    #[inline(always)]
    pub(super) fn classes64(block: &[u8; 64]) -> super::Classes {
        let mut m = super::Classes::default();
        let mut backslash = zeroed_m128i();
        let mut lowest = set_splat_i8_m128i(-1);
        let mut rest: &[u8] = block;
        let mut shift = 0;
        while let Some((chunk, tail)) = rest.split_first_chunk::<16>() {
            let v = load_unaligned_m128i(chunk);
            m.quote |= bits(eq(v, b'"')) << shift;
            m.bracket |= bits(bracket(v)) << shift;
            backslash = bitor_m128i(backslash, eq(v, b'\\'));
            lowest = min_u8_m128i(lowest, v);
            rest = tail;
            shift += 16;
        }
        m.rare = bits(bitor_m128i(backslash, control(lowest)));
        m
    }
}

/// The byte classes of a 64-byte block; `rare` only says whether one is there (see
/// [`Classes::rare`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn classes64(block: &[u8; 64]) -> Classes {
    sse2::classes64(block)
}

/// Deepest nesting [`skip_container`] follows (one bit of [`Nesting`] per level).
const MAX_SKIP_DEPTH: u32 = 128;

/// The byte at `i`, or 0 past the end. A 0 byte is never valid where one is looked at, so
/// the fast paths need no separate test for the end.
#[inline(always)]
fn at(b: &[u8], i: usize) -> u8 {
    b.get(i).copied().unwrap_or(0)
}

#[inline(always)]
fn skip_ws(b: &[u8], i: usize) -> usize {
    next(b, i).0
}

/// Skips whitespace from `i`: the index of the next other byte, and that byte (0 at the end).
#[inline(always)]
fn next(b: &[u8], mut i: usize) -> (usize, u8) {
    loop {
        let c = at(b, i);
        // Everything above the space is not whitespace: one test on the common path.
        if c > b' ' || !matches!(c, b' ' | b'\n' | b'\r' | b'\t') {
            return (i, c);
        }
        i += 1;
    }
}

fn fail<T>(at: usize, what: &'static str) -> Scanned<T> {
    Err(Syntax { at, what })
}

/// Bytes looked at in one step of a string scan.
const STEP: usize = 16;

/// The string stops among 16 bytes: bit `n` set when byte `n` is `"`, `\` or a control byte
/// (below 0x20).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn stops_in(chunk: &[u8; STEP]) -> u32 {
    sse2::string_stops(chunk)
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn stops_in(chunk: &[u8; STEP]) -> u32 {
    portable::string_stops(chunk)
}

/// At `\`: the index just past the escape sequence.
#[cold]
fn escape(b: &[u8], i: usize) -> Scanned<usize> {
    match at(b, i + 1) {
        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Ok(i + 2),
        b'u' => {
            let hex = b.get(i + 2..i + 6);
            if hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                Ok(i + 6)
            } else {
                fail(i + 2, "invalid escape")
            }
        }
        _ => fail(i + 1, "invalid escape"),
    }
}

/// A literal (`true`, `false`, `null`) at `i`: the index past it.
#[inline(always)]
fn literal(b: &[u8], i: usize, word: &'static [u8]) -> Scanned<usize> {
    if b.get(i..i + word.len()) == Some(word) {
        Ok(i + word.len())
    } else {
        fail(i, "expected value")
    }
}

#[inline(always)]
fn digits(b: &[u8], mut i: usize) -> usize {
    while at(b, i).is_ascii_digit() {
        i += 1;
    }
    i
}

/// A number at `i`, by the JSON grammar: the index past it.
fn number(b: &[u8], mut i: usize) -> Scanned<usize> {
    if at(b, i) == b'-' {
        i += 1;
    }
    match at(b, i) {
        b'0' => i += 1,
        b'1'..=b'9' => i = digits(b, i + 1),
        _ => return fail(i, "invalid number"),
    }
    if at(b, i) == b'.' {
        if !at(b, i + 1).is_ascii_digit() {
            return fail(i + 1, "invalid number");
        }
        i = digits(b, i + 1);
    }
    if let b'e' | b'E' = at(b, i) {
        i += 1;
        if let b'+' | b'-' = at(b, i) {
            i += 1;
        }
        if !at(b, i).is_ascii_digit() {
            return fail(i, "invalid number");
        }
        i = digits(b, i);
    }
    Ok(i)
}

/// The open containers of a skipped value: one bit per level, innermost lowest, 1 for an
/// object and 0 for an array.
#[derive(Clone, Copy)]
struct Nesting {
    kinds: u128,
    depth: u32,
}

impl Nesting {
    /// Opens the container whose bracket is `open`.
    #[inline(always)]
    fn open(&mut self, at: usize, open: u8) -> Scanned<()> {
        if self.depth == MAX_SKIP_DEPTH {
            return fail(at, "recursion limit exceeded");
        }
        self.depth += 1;
        self.kinds = (self.kinds << 1) | u128::from(open == b'{');
        Ok(())
    }

    /// Closes the innermost container with `close`: `true` when none is left open.
    #[inline(always)]
    fn close(&mut self, at: usize, close: u8) -> Scanned<bool> {
        let object = self.kinds & 1 == 1;
        if object != (close == b'}') {
            return fail(
                at,
                if object {
                    "expected `,` or `}`"
                } else {
                    "expected `,` or `]`"
                },
            );
        }
        self.depth -= 1;
        self.kinds >>= 1;
        Ok(self.depth == 0)
    }

    fn eof<T>(&self, at: usize) -> Scanned<T> {
        fail(
            at,
            if self.kinds & 1 == 1 {
                "EOF while parsing an object"
            } else {
                "EOF while parsing a list"
            },
        )
    }
}

/// At `{` or `[`: the index past the matching bracket. What lies between is checked for
/// structure, not grammar (see the module's contract).
#[inline(never)]
fn skip_container(b: &[u8], start: usize) -> Scanned<usize> {
    let open = at(b, start);
    // `{}` and `[]` are common (`meta`, `profile`, `routes`): no block for them.
    let (first, c) = next(b, start + 1);
    if c == open + 2 {
        return Ok(first + 1);
    }
    let mut nest = Nesting { kinds: 0, depth: 0 };
    nest.open(start, open)?;
    let mut i = start + 1;
    let mut in_string = false;
    let mut pad = [0u8; 64];
    loop {
        if i >= b.len() {
            return if in_string {
                fail(b.len(), "EOF while parsing a string")
            } else {
                nest.eof(b.len())
            };
        }
        // The last bytes of the text are padded with spaces, which have no class.
        let block = block_at(b, i, b' ', &mut pad);
        let m = classes64(block);
        if m.rare != 0 {
            // A backslash or a control byte in this block: one byte at a time (an escape
            // may run past it; the walk goes on from where it ended).
            match bytewise(b, i, b.len().min(i + 64), in_string, nest)? {
                Walk::Closed(end) => return Ok(end),
                Walk::Reached(next, s, n) => (i, in_string, nest) = (next, s, n),
            }
            continue;
        }
        let mut inside = inside_strings(m.quote);
        if in_string {
            inside = !inside;
        }
        in_string = inside >> 63 == 1;
        let mut brackets = m.bracket & !inside;
        while brackets != 0 {
            let k = brackets.trailing_zeros() as usize;
            brackets &= brackets - 1;
            let c = block.get(k).copied().unwrap_or_default();
            if c == b'{' || c == b'[' {
                nest.open(i + k, c)?;
            } else if nest.close(i + k, c)? {
                return Ok(i + k + 1);
            }
        }
        i += 64;
    }
}

/// The 64 bytes of `b` from `i`; past the end of the text, `fill` (the bytes that are
/// there are copied into `pad`, the rest of it filled).
#[inline(always)]
fn block_at<'t>(b: &'t [u8], i: usize, fill: u8, pad: &'t mut [u8; 64]) -> &'t [u8; 64] {
    let rest = b.get(i..).unwrap_or_default();
    if let Some(block) = rest.first_chunk::<64>() {
        return block;
    }
    *pad = [fill; 64];
    if let Some(head) = pad.get_mut(..rest.len()) {
        head.copy_from_slice(rest);
    }
    pad
}

/// Bit n set when byte n lies inside a string (its opening quote in, its closing quote
/// out), for a block that starts outside strings: a prefix XOR over the quotes.
#[inline(always)]
fn inside_strings(quote: u64) -> u64 {
    let mut inside = quote;
    inside ^= inside << 1;
    inside ^= inside << 2;
    inside ^= inside << 4;
    inside ^= inside << 8;
    inside ^= inside << 16;
    inside ^= inside << 32;
    inside
}

/// Where [`bytewise`] ended.
enum Walk {
    /// The outermost container closed: the index past its bracket.
    Closed(usize),
    /// The stop was reached (or passed, by an escape): the index to go on from, whether it
    /// is inside a string, and the containers still open.
    Reached(usize, bool, Nesting),
}

/// Walks bytes from `i` up to `stop` (past it when an escape runs on) with the same checks
/// as [`skip_container`].
#[cold]
fn bytewise(
    b: &[u8],
    mut i: usize,
    stop: usize,
    mut in_string: bool,
    mut nest: Nesting,
) -> Scanned<Walk> {
    while i < stop {
        let c = at(b, i);
        if in_string {
            match c {
                b'"' => in_string = false,
                b'\\' => {
                    i = escape(b, i)?;
                    continue;
                }
                0..=0x1f => {
                    return fail(
                        i,
                        "control character (\\u0000-\\u001F) found while parsing a string",
                    )
                }
                _ => {}
            }
        } else {
            match c {
                b'"' => in_string = true,
                b'{' | b'[' => nest.open(i, c)?,
                // `close` pops the container whether or not it was the outermost.
                b'}' | b']' if nest.close(i, c)? => return Ok(Walk::Closed(i + 1)),
                b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t' => {}
                0..=0x1f => return fail(i, "expected value"),
                _ => {}
            }
        }
        i += 1;
    }
    Ok(Walk::Reached(i, in_string, nest))
}

/// What [`skip_container`] needs to know of a block of up to 64 bytes: bit n for byte n.
#[derive(Debug, Default, PartialEq, Eq)]
struct Classes {
    quote: u64,
    /// `{`, `[`, `}` or `]`.
    bracket: u64,
    /// `\` or a byte below 0x20 (tab, line feed and carriage return included: whitespace
    /// outside a string, an error inside one): a block holding one is walked a byte at a
    /// time. [`classes64`] on x86-64 says only whether there is one (not zero), not where.
    /// Compact JSON, as Nova and Python's `json.dumps` write it, has none outside escapes.
    rare: u64,
}

#[cfg(all(test, target_arch = "x86_64"))]
#[inline(always)]
fn classes16(chunk: &[u8; 16]) -> Classes {
    sse2::classes(chunk)
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn classes16(chunk: &[u8; 16]) -> Classes {
    portable::classes(chunk)
}

/// The byte classes one byte at a time: used where SSE2 is not, and in tests as the
/// reference the SSE2 versions are checked against.
#[cfg(any(test, not(target_arch = "x86_64")))]
mod portable {
    use super::Classes;

    pub(super) fn string_stops(chunk: &[u8; 16]) -> u32 {
        let mut stops = 0;
        for (n, &c) in chunk.iter().enumerate() {
            if c == b'"' || c == b'\\' || c < 0x20 {
                stops |= 1 << n;
            }
        }
        stops
    }

    pub(super) fn classes(chunk: &[u8; 16]) -> Classes {
        let mut m = Classes::default();
        for (n, &c) in chunk.iter().enumerate() {
            let bit = 1u64 << n;
            match c {
                b'"' => m.quote |= bit,
                b'{' | b'[' | b'}' | b']' => m.bracket |= bit,
                b'\\' | 0..=0x1f => m.rare |= bit,
                _ => {}
            }
        }
        m
    }
}

/// [`classes16`] over four chunks.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn classes64(block: &[u8; 64]) -> Classes {
    let mut m = Classes::default();
    let mut rest: &[u8] = block;
    let mut shift = 0;
    while let Some((chunk, tail)) = rest.split_first_chunk::<16>() {
        let c = classes16(chunk);
        m.quote |= c.quote << shift;
        m.bracket |= c.bracket << shift;
        m.rare |= c.rare << shift;
        rest = tail;
        shift += 16;
    }
    m
}

/// Bytes in one window of string stops ([`Scan::string_end`]).
const WINDOW: usize = 64;

/// The string stops (`"`, `\`, control bytes) of the 64 bytes from `w`: bit n for byte
/// `w + n`. Past the end of the text every byte counts as a stop (the 0 [`at`] gives there).
#[inline(always)]
fn window_stops(b: &[u8], w: usize) -> u64 {
    let mut pad = [0u8; WINDOW];
    let block = block_at(b, w, 0, &mut pad);
    let mut stops = 0;
    let mut tail: &[u8] = block;
    let mut shift = 0;
    while let Some((chunk, more)) = tail.split_first_chunk::<STEP>() {
        stops |= u64::from(stops_in(chunk)) << shift;
        tail = more;
        shift += STEP;
    }
    stops
}

/// A cursor over the text, for the levels prediction reads (the list, each VIF, `details`).
struct Scan<'a> {
    text: &'a str,
    b: &'a [u8],
    i: usize,
    /// Start of the window whose string stops are in `stops` (a multiple of [`WINDOW`];
    /// `usize::MAX` before the first).
    w: usize,
    stops: u64,
}

impl<'a> Scan<'a> {
    fn new(text: &'a str) -> Self {
        Scan {
            text,
            b: text.as_bytes(),
            i: 0,
            w: usize::MAX,
            stops: 0,
        }
    }

    /// From just past an opening quote: the index of the closing quote, and whether an
    /// escape came before it. The stops come from 64-byte windows at fixed offsets, kept
    /// from one string to the next: finding a string's end takes a shift and a bit scan,
    /// not a load and a compare on the path from one token to the next.
    #[inline(always)]
    fn string_end(&mut self, mut i: usize) -> Scanned<(usize, bool)> {
        let mut escaped = false;
        loop {
            let w = i & !(WINDOW - 1);
            if w != self.w {
                self.w = w;
                self.stops = window_stops(self.b, w);
            }
            let ahead = self.stops >> (i - w);
            if ahead == 0 {
                i = w + WINDOW;
                continue;
            }
            i += ahead.trailing_zeros() as usize;
            match at(self.b, i) {
                b'"' => return Ok((i, escaped)),
                b'\\' => {
                    escaped = true;
                    i = escape(self.b, i)?;
                }
                _ if i >= self.b.len() => return fail(i, "EOF while parsing a string"),
                _ => {
                    return fail(
                        i,
                        "control character (\\u0000-\\u001F) found while parsing a string",
                    )
                }
            }
        }
    }

    fn fail<T>(&self, what: &'static str) -> Scanned<T> {
        fail(self.i, what)
    }

    #[inline(always)]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    #[inline(always)]
    fn ws(&mut self) {
        self.i = skip_ws(self.b, self.i);
    }

    /// Skips whitespace and one value. A string, number or literal is checked in full; an
    /// object or array is checked for structure only (see [`skip_container`]).
    #[inline(always)]
    fn skip_value(&mut self) -> Scanned<()> {
        let (i, c) = next(self.b, self.i);
        let b = self.b;
        self.i = match c {
            b'"' => self.string_end(i + 1)?.0 + 1,
            b'{' | b'[' => skip_container(b, i)?,
            b't' => literal(b, i, b"true")?,
            b'f' => literal(b, i, b"false")?,
            b'n' => literal(b, i, b"null")?,
            b'-' | b'0'..=b'9' => number(b, i)?,
            _ if i >= b.len() => return fail(i, "EOF while parsing a value"),
            _ => return fail(i, "expected value"),
        };
        Ok(())
    }

    /// At `"`: steps over the string; its contents' byte range and whether it holds an escape.
    #[inline(always)]
    fn string(&mut self) -> Scanned<(usize, usize, bool)> {
        let start = self.i + 1;
        let (end, escaped) = self.string_end(start)?;
        self.i = end + 1;
        Ok((start, end, escaped))
    }

    /// The text of a string scanned by [`Scan::string`], unescaped.
    fn unescaped(&self, start: usize, end: usize, escaped: bool) -> Scanned<Cow<'a, str>> {
        let bad = Syntax {
            at: start,
            what: "invalid string",
        };
        if !escaped {
            // Both ends sit next to an ASCII quote, so they are character boundaries.
            return self.text.get(start..end).map(Cow::Borrowed).ok_or(bad);
        }
        // Rare: let serde_json decode the escapes (with the quotes around the contents).
        let quoted = self.text.get(start - 1..end + 1).ok_or(Syntax {
            at: start,
            what: "invalid string",
        })?;
        serde_json::from_str::<String>(quoted)
            .map(Cow::Owned)
            .map_err(|_| bad)
    }

    /// Skips whitespace, then reads an object key and its `:`.
    #[inline(always)]
    fn key(&mut self) -> Scanned<Key> {
        let (i, c) = next(self.b, self.i);
        if c != b'"' {
            return fail(i, "key must be a string");
        }
        let start = i + 1;
        let (end, escaped) = self.string_end(start)?;
        let key = if escaped {
            Key::of(self.unescaped(start, end, true)?.as_bytes())
        } else {
            Key::of(self.b.get(start..end).unwrap_or_default())
        };
        let (i, c) = next(self.b, end + 1);
        if c != b':' {
            return fail(i, "expected `:`");
        }
        self.i = i + 1;
        Ok(key)
    }

    /// A literal at the cursor.
    #[inline]
    fn literal(&mut self, word: &'static [u8]) -> Scanned<()> {
        self.i = literal(self.b, self.i, word)?;
        Ok(())
    }

    /// A field prediction reads: `null` is absent; strings and booleans are kept; anything
    /// else is kept as its text.
    #[inline(always)]
    fn scalar(&mut self) -> Scanned<Option<Scalar<'a>>> {
        self.ws();
        match self.peek() {
            Some(b'"') => {
                let (start, end, escaped) = self.string()?;
                let raw = self.text.get(start..end).ok_or(Syntax {
                    at: start,
                    what: "invalid string",
                })?;
                Ok(Some(Scalar::Str(raw, escaped)))
            }
            Some(b't') => self.literal(b"true").map(|()| Some(Scalar::Bool(true))),
            Some(b'f') => self.literal(b"false").map(|()| Some(Scalar::Bool(false))),
            Some(b'n') => self.literal(b"null").map(|()| None),
            _ => {
                let start = self.i;
                self.skip_value()?;
                let text = self.text.get(start..self.i).ok_or(Syntax {
                    at: start,
                    what: "expected value",
                })?;
                Ok(Some(Scalar::Other(text)))
            }
        }
    }

    /// After a member of an object being read: `true` at `,`, `false` at `}`.
    #[inline]
    fn more_members(&mut self) -> Scanned<bool> {
        let (i, c) = next(self.b, self.i);
        self.i = i + 1;
        match c {
            b',' => Ok(true),
            b'}' => Ok(false),
            _ if i >= self.b.len() => fail(i, "EOF while parsing an object"),
            _ => fail(i, "expected `,` or `}`"),
        }
    }

    /// At `{`: true when the object is empty (and stepped over).
    #[inline]
    fn open_object(&mut self) -> bool {
        self.i += 1;
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            true
        } else {
            false
        }
    }

    /// `details`: an object read for `ovs_hybrid_plug`, `null`, or anything else.
    fn details(&mut self) -> Scanned<LeanDetails<'a>> {
        self.ws();
        match self.peek() {
            Some(b'{') => {
                let mut hybrid = None;
                if !self.open_object() {
                    loop {
                        if self.key()? == Key::OvsHybridPlug {
                            hybrid = self.scalar()?;
                        } else {
                            self.skip_value()?;
                        }
                        if !self.more_members()? {
                            break;
                        }
                    }
                }
                Ok(LeanDetails::Object(hybrid))
            }
            Some(b'n') => self.literal(b"null").map(|()| LeanDetails::Absent),
            _ => self.skip_value().map(|()| LeanDetails::NotObject),
        }
    }

    /// At `{`: one VIF dict. Later keys overwrite earlier ones, as in `serde_json::Value`.
    fn vif(&mut self) -> Scanned<LeanVif<'a>> {
        let mut v = LeanVif::default();
        if self.open_object() {
            return Ok(v);
        }
        loop {
            let key = self.key()?;
            // Most keys are not read: one test for them, not a jump through a table.
            if matches!(key, Key::Other | Key::OvsHybridPlug) {
                self.skip_value()?;
            } else if key == Key::Details {
                v.details = self.details()?;
            } else {
                let value = self.scalar()?;
                match key {
                    Key::Id => v.id = value,
                    Key::Type => v.vif_type = value,
                    Key::VnicType => v.vnic_type = value,
                    _ => v.active = value,
                }
            }
            if !self.more_members()? {
                return Ok(v);
            }
        }
    }

    /// The whole document: the list's items (`None` for an item that is not an object), or
    /// `Ok(None)` for a well-formed document that is not a list.
    fn document(&mut self) -> Scanned<Option<Vec<Option<LeanVif<'a>>>>> {
        self.ws();
        let list = if self.peek() == Some(b'[') {
            self.i += 1;
            self.ws();
            let mut items = Vec::new();
            if self.peek() == Some(b']') {
                self.i += 1;
            } else {
                loop {
                    self.ws();
                    if self.peek() == Some(b'{') {
                        items.push(Some(self.vif()?));
                    } else {
                        self.skip_value()?;
                        items.push(None);
                    }
                    self.ws();
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            break;
                        }
                        None => return self.fail("EOF while parsing a list"),
                        Some(_) => return self.fail("expected `,` or `]`"),
                    }
                }
            }
            Some(items)
        } else {
            self.skip_value()?;
            None
        };
        self.ws();
        if self.i < self.b.len() {
            return self.fail("trailing characters");
        }
        Ok(list)
    }
}

struct Ctx<'a> {
    index: usize,
    port: &'a str,
}

impl Ctx<'_> {
    fn err(&self, field: &str, problem: Problem) -> PredictError {
        PredictError::NetworkInfo(VifError::Field {
            index: self.index,
            port: self.port.to_owned(),
            field: field.to_owned(),
            problem,
        })
    }

    fn str<'s>(
        &self,
        v: Option<Scalar<'s>>,
        field: &str,
    ) -> Result<Option<Cow<'s, str>>, PredictError> {
        match v {
            None => Ok(None),
            Some(Scalar::Str(raw, escaped)) => decoded(raw, escaped).map(Some),
            Some(_) => Err(self.err(field, Problem::NotString)),
        }
    }

    fn bool(&self, v: Option<Scalar<'_>>, field: &str) -> Result<bool, PredictError> {
        let text = match v {
            None => return Ok(false),
            Some(Scalar::Bool(b)) => return Ok(b),
            Some(Scalar::Str(raw, escaped)) => decoded(raw, escaped)?,
            Some(Scalar::Other(_)) => Cow::Borrowed(""),
        };
        if text.eq_ignore_ascii_case("true") {
            Ok(true)
        } else if text.eq_ignore_ascii_case("false") {
            Ok(false)
        } else {
            // The value as JSON text, as the full parser shows it.
            Err(self.err(
                field,
                Problem::NotBool(v.map(|v| v.shown()).unwrap_or_default()),
            ))
        }
    }
}

/// Predict from `network_info` JSON text. Same result as parsing with
/// [`crate::vif::NetworkInfo::parse`] and calling [`super::predict`], for any `network_info`
/// the full parser accepts; it checks only the fields it reads (see the module's contract).
pub fn predict_json(
    operation: &Operation,
    network_info: &str,
    wiring: &Wiring,
) -> Result<Prediction, PredictError> {
    let column = operation.column()?;
    let mut scan = Scan::new(network_info);
    let list = scan
        .document()
        .map_err(|e| e.into_error(network_info))?
        .ok_or(PredictError::NetworkInfo(VifError::NotAList))?;
    let mut out = Vec::with_capacity(list.len());
    // Made only for lists longer than 32 (creating one costs more than a short scan).
    let mut seen: Option<HashSet<PortId>> = None;
    for (index, item) in list.iter().enumerate() {
        let Some(v) = item else {
            return Err(PredictError::NetworkInfo(VifError::NotAnObject { index }));
        };
        let (port, vif_type, vnic_type, active, hybrid) = match plain_fields(v) {
            Some(f) => f,
            None => fields(index, v)?,
        };
        // Instances have a handful of VIFs: a linear scan beats hashing up to a few dozen.
        let new = seen.as_mut().is_some_and(|seen| seen.insert(port));
        let dup = if new {
            None
        } else {
            out.iter().position(|p: &VifPrediction| p.port == port)
        };
        if let Some(first) = dup {
            // The port as given (another spelling of a duplicate may differ in case).
            let id_text = v.port_text()?;
            let c = Ctx {
                index,
                port: &id_text,
            };
            return Err(c.err("id", Problem::Duplicate(first)));
        }
        if out.len() == 31 {
            let mut all: HashSet<PortId> = out.iter().map(|p| p.port).collect();
            all.insert(port);
            seen = Some(all);
        }
        let kind = classify(vif_type, vnic_type, hybrid, wiring).map_err(|why| {
            PredictError::Unsupported {
                index,
                port,
                vif_type,
                vnic_type,
                why,
            }
        })?;
        let cell = table_cell(column, kind, active);
        out.push(VifPrediction {
            index,
            port,
            kind,
            timing: cell.timing,
            reason: cell.reason,
        });
    }
    Ok(Prediction { column, vifs: out })
}

/// The fields prediction reads, checked with the errors of the full parser.
fn fields(index: usize, v: &LeanVif<'_>) -> Result<Fields, PredictError> {
    let id_text = v.port_text()?;
    let c = Ctx {
        index,
        port: &id_text,
    };
    let port: PortId = match c.str(v.id, "id")? {
        None => return Err(c.err("id", Problem::Missing)),
        Some(s) => s.parse().map_err(|p| c.err("id", p))?,
    };
    let vif_type: VifType = match c.str(v.vif_type, "type")? {
        None => return Err(c.err("type", Problem::Missing)),
        Some(s) => s.parse().map_err(|p| c.err("type", p))?,
    };
    let vnic_type: VnicType = match c.str(v.vnic_type, "vnic_type")? {
        None => VnicType::Normal,
        Some(s) => s.parse().map_err(|p| c.err("vnic_type", p))?,
    };
    let active = c.bool(v.active, "active")?;
    let hybrid = match v.details {
        LeanDetails::Absent => false,
        LeanDetails::Object(h) => c.bool(h, "details.ovs_hybrid_plug")?,
        LeanDetails::NotObject => return Err(c.err("details", Problem::NotObject)),
    };
    Ok((port, vif_type, vnic_type, active, hybrid))
}

/// Port, vif_type, vnic_type, active, hybrid plug.
type Fields = (PortId, VifType, VnicType, bool, bool);

/// [`fields`] where every field is well formed and plainly written (strings without
/// escapes, JSON booleans), which is what Nova writes: no error to build, nothing to decode.
/// `None` sends the VIF to [`fields`].
#[inline]
fn plain_fields(v: &LeanVif<'_>) -> Option<Fields> {
    let Some(Scalar::Str(id, false)) = v.id else {
        return None;
    };
    let Some(Scalar::Str(vif_type, false)) = v.vif_type else {
        return None;
    };
    let vnic_type = match v.vnic_type {
        None => VnicType::Normal,
        Some(Scalar::Str(s, false)) => s.parse().ok()?,
        Some(_) => return None,
    };
    let active = match v.active {
        None => false,
        Some(Scalar::Bool(b)) => b,
        Some(_) => return None,
    };
    let hybrid = match v.details {
        LeanDetails::Absent | LeanDetails::Object(None) => false,
        LeanDetails::Object(Some(Scalar::Bool(b))) => b,
        _ => return None,
    };
    Some((
        id.parse().ok()?,
        vif_type.parse().ok()?,
        vnic_type,
        active,
        hybrid,
    ))
}

#[cfg(test)]
mod tests;
