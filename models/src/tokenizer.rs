//! A character-level tokenizer for the built-in text environments.
//!
//! The vocabulary is fixed (100 ids): four special tokens, the newline (which ends a step),
//! then printable ASCII.

use rlany_framework::Tokenizer;

/// Id of the padding token.
const PAD: u32 = 0;
/// Id of the beginning-of-sequence token.
const BOS: u32 = 1;
/// Id of the end-of-sequence token.
const EOS: u32 = 2;
/// Id of the unknown-character token.
const UNK: u32 = 3;
/// Id of `'\n'`.
const NEWLINE: u32 = 4;
/// Id of the first printable ASCII character (`' '`, code 32).
const FIRST_PRINTABLE: u32 = 5;
/// Number of ids.
const VOCAB: usize = 100;

/// Character tokenizer: `0 = <pad>`, `1 = <bos>`, `2 = <eos>`, `3 = <unk>`, `4 = '\n'`,
/// then the printable ASCII characters `' '..='~'` (codes 32..=126) in order as ids 5..=99.
///
/// [`Tokenizer::encode`] maps every other character to `<unk>`; [`Tokenizer::decode`] drops
/// `<pad>`, `<bos>` and `<eos>`, renders `<unk>` (and any id outside the vocabulary) as `'?'`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CharTokenizer;

impl CharTokenizer {
    /// The tokenizer (it has no state).
    pub fn new() -> Self {
        Self
    }

    fn char_id(c: char) -> u32 {
        match c {
            '\n' => NEWLINE,
            ' '..='~' => u32::from(c) - 32 + FIRST_PRINTABLE,
            _ => UNK,
        }
    }
}

impl Tokenizer for CharTokenizer {
    fn encode(&self, text: &str) -> Vec<u32> {
        text.chars().map(Self::char_id).collect()
    }

    fn decode(&self, ids: &[u32]) -> String {
        let mut out = String::with_capacity(ids.len());
        for &id in ids {
            match id {
                PAD | BOS | EOS => {}
                NEWLINE => out.push('\n'),
                id if (FIRST_PRINTABLE..VOCAB as u32).contains(&id) => {
                    // Ids 5..=99 are the codes 32..=126, all valid chars.
                    out.push(char::from((id - FIRST_PRINTABLE + 32) as u8));
                }
                _ => out.push('?'),
            }
        }
        out
    }

    fn vocab_size(&self) -> usize {
        VOCAB
    }

    fn bos(&self) -> u32 {
        BOS
    }

    fn eos(&self) -> u32 {
        EOS
    }

    fn pad(&self) -> u32 {
        PAD
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_ids_and_vocab() {
        let t = CharTokenizer::new();
        assert_eq!(t.pad(), 0);
        assert_eq!(t.bos(), 1);
        assert_eq!(t.eos(), 2);
        assert_eq!(t.encode("\n"), vec![4]);
        // Lines: a step stops at the newline or EOS.
        assert_eq!(t.prompt_format().stop_tokens(&t), vec![4, 2]);
        assert_eq!(t.vocab_size(), 100);
    }

    #[test]
    fn encode_hand_checked_ids() {
        let t = CharTokenizer::new();
        // ' ' = 32 -> 5, '!' = 33 -> 6, '0' = 48 -> 21, 'A' = 65 -> 38, 'a' = 97 -> 70,
        // '~' = 126 -> 99, '\n' -> 4, 'é' and '\t' -> unk (3).
        assert_eq!(t.encode(" !0Aa~\n"), vec![5, 6, 21, 38, 70, 99, 4]);
        assert_eq!(t.encode("é\t"), vec![3, 3]);
        assert_eq!(t.encode("17+25=42"), vec![22, 28, 16, 23, 26, 34, 25, 23]);
        assert!(t.encode("").is_empty());
    }

    #[test]
    fn decode_drops_specials_and_renders_unk() {
        let t = CharTokenizer::new();
        assert_eq!(t.decode(&[1, 38, 0, 3, 4, 70, 2, 0]), "A?\na");
        assert_eq!(t.decode(&[100, 5000]), "??");
    }

    #[test]
    fn round_trip_of_printable_text() {
        let t = CharTokenizer::new();
        let text = "put a clean mug in cabinet 2\nclick(3) ~{}|`\n";
        let ids = t.encode(text);
        assert!(ids.iter().all(|&id| (4..100).contains(&id)));
        assert_eq!(t.decode(&ids), text);
        // Every id 4..100 decodes to one char that encodes back to it.
        for id in 4..100u32 {
            assert_eq!(t.encode(&t.decode(&[id])), vec![id]);
        }
    }

    /// environments/process/PROTOCOL.md's worked example, token for token: the context a
    /// scratch model reads for a two-step episode of the reference environment.
    #[test]
    fn the_protocols_worked_example_is_what_the_policy_reads() {
        use rlany_framework::PromptFormat;
        let t = CharTokenizer::new();
        let f = PromptFormat::Lines;
        let mut ctx = f.start(
            &t,
            "from 6 to 9, steps up to 2\n",
            Some("instructions unseen"),
        );
        for (action, obs) in [("+2\n", "at 8"), ("+1\n", "at 9")] {
            let generated = t.encode(action);
            ctx.extend(&generated);
            ctx.extend(f.close_action(&t, &generated));
            ctx.extend(f.observation(&t, obs));
        }
        let doc: Vec<u32> = [
            &[1][..],
            &[
                75, 87, 84, 82, 5, 27, 5, 89, 84, 5, 30, 17, 5, 88, 89, 74, 85, 88, 5, 90, 85, 5,
                89, 84, 5, 23, 4,
            ],
            &[16, 23, 4],
            &[70, 89, 5, 29, 4],
            &[16, 22, 4],
            &[70, 89, 5, 30, 4],
        ]
        .concat();
        assert_eq!(ctx, doc);
        assert_eq!(ctx.len(), 44);
    }
}
